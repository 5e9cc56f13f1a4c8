"""The dense layers' products through oneDNN (`captioner.models.products`): the numbers of
`F.linear` and autograd to fp32 rounding, the route really taken where it applies and not where
it does not, and a weight reordered once per decoding loop and anew in the next."""

from __future__ import annotations

import copy
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from captioner.models import products
from captioner.models.products import gram, linear, onednn_linear, prepared, reused_weights

from helpers import require, require_module, tiny_config, tiny_model

FP32 = {"atol": 2e-5, "rtol": 1e-5}  # another summation order: fp32 rounding over a few hundred terms


@pytest.fixture(autouse=True)
def checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The route's first-use check counts as done (its tests below undo this), so it makes no
    product of its own inside a test that counts them; weight and input gradients through oneDNN unless a test says."""
    monkeypatch.setattr(products, "_CHECKED", True, raising=False)
    monkeypatch.setattr(products, "_GRAM_MM", False)
    monkeypatch.setattr(products, "_GRAD_MM", False)


def needs_onednn() -> None:
    require(products.onednn_enabled(), "this torch build has no oneDNN inner product (torch.ops.mkldnn)")


@pytest.fixture(params=["onednn", "f_linear"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The tests of numbers run with the route on and off."""
    if request.param == "onednn":
        needs_onednn()
    monkeypatch.setattr(products, "_ENABLED", request.param == "onednn")
    return request.param


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The input shape of every oneDNN product made, in order."""
    needs_onednn()
    made: list[tuple[int, ...]] = []
    original = products._INNER_PRODUCT

    def counting(x, packed, bias, *rest):
        made.append(tuple(x.shape))
        return original(x, packed, bias, *rest)

    monkeypatch.setattr(products, "_INNER_PRODUCT", counting)
    monkeypatch.setattr(products, "_ENABLED", True)
    return made


@pytest.mark.parametrize("shape", [(7, 33), (2, 5, 33), (33, 7)], ids=["2d", "3d", "transposed-view"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_gives_f_linear_through_onednn(shape, with_bias, calls, route: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(products, "_ENABLED", route == "onednn")
    torch.manual_seed(0)
    x = torch.randn(shape) if shape != (33, 7) else torch.randn(shape).t()  # (7, 33) with strides of its transpose
    layer = onednn_linear(nn.Linear(33, 19, bias=with_bias))
    with torch.no_grad():
        got = layer(x)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), **FP32)
    assert calls == ([tuple(x.shape)] if route == "onednn" else [])


@pytest.mark.parametrize("out_features", [9, 300], ids=["x-reordered", "gradient-reordered"])  # gram's two ways
def test_gradients_are_autograds(out_features: int, calls, route: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(products, "_ENABLED", route == "onednn")
    torch.manual_seed(1)
    layer = onednn_linear(nn.Linear(40, out_features))
    x = torch.randn(3, 11, 40, requires_grad=True)
    weights = torch.randn(3, 11, out_features)
    (layer(x) * weights).sum().backward()
    got = [x.grad, layer.weight.grad, layer.bias.grad]
    assert len(calls) == (3 if route == "onednn" else 0)  # forward, the input's gradient, the weight's gradient
    x.grad = layer.weight.grad = layer.bias.grad = None
    (F.linear(x, layer.weight, layer.bias) * weights).sum().backward()
    for g, want in zip(got, [x.grad, layer.weight.grad, layer.bias.grad]):
        torch.testing.assert_close(g, want, **FP32)


def test_a_frozen_layer_still_passes_its_input_gradient(calls) -> None:
    """Grad-CAM differentiates the output with respect to the features through frozen weights."""
    torch.manual_seed(2)
    layer = onednn_linear(nn.Linear(8, 5)).requires_grad_(False)
    x = torch.randn(4, 8, requires_grad=True)
    layer(x).square().sum().backward()
    want = torch.autograd.grad(F.linear(x, layer.weight, layer.bias).square().sum(), x)[0]
    torch.testing.assert_close(x.grad, want, **FP32)
    assert layer.weight.grad is None


def test_a_routed_layer_stays_an_nn_linear_that_copies_and_pickles(calls) -> None:
    """`onednn_linear` sets the forward alone; a copy or an unpickled layer takes the route over its own weight."""
    layer, x = onednn_linear(nn.Linear(6, 4)), torch.randn(3, 6)
    assert type(layer) is nn.Linear and list(layer.state_dict()) == ["weight", "bias"]
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        other.weight.data.add_(1)
        torch.testing.assert_close(other(x), F.linear(x, other.weight, other.bias), **FP32)
    assert calls == [(3, 6), (3, 6)]


def test_weights_are_reordered_once_per_scope_and_anew_in_the_next(calls, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside `reused_weights` (a decoding loop) a weight is reordered once and reused; the next
    scope reorders it again, so a change between them is seen: a fused AdamW step, which changes
    the weights in place without bumping their version (a cache keyed on it went stale and
    scored the validation of a resumed run with old weights), and a load_state_dict."""
    torch.manual_seed(3)
    layer = onednn_linear(nn.Linear(16, 12))
    x = torch.randn(5, 16)
    made = []
    original = products._reorder
    monkeypatch.setattr(products, "_reorder", lambda w: made.append(w.shape) or original(w))
    with torch.no_grad(), reused_weights():
        layer(x), layer(x)
        with reused_weights():  # nested: the outer copies serve
            layer(x)
    assert len(made) == 1
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.5, fused=True)
    F.linear(x, layer.weight, layer.bias).square().sum().backward()
    version = layer.weight._version
    optimizer.step()
    assert layer.weight._version == version  # why the scope, not the version, decides
    other = nn.Linear(16, 12)
    with torch.no_grad():
        with reused_weights():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), **FP32)
        layer.load_state_dict(other.state_dict())
        with reused_weights():
            torch.testing.assert_close(layer(x), other(x), **FP32)
        layer(x), layer(x)  # outside a scope: every call reorders
    assert len(made) == 5


def test_decoding_reorders_each_weight_once_per_search(monkeypatch: pytest.MonkeyPatch) -> None:
    needs_onednn()
    from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search
    from captioner.models.decoders.lstm import LSTMConfig, LSTMDecoder

    torch.manual_seed(6)
    decoder = LSTMDecoder(LSTMConfig(embed_dim=6, hidden_dim=10, attention_dim=5), 30, 8).eval()
    monkeypatch.setattr(products, "_ENABLED", True)
    made = []
    original = products._reorder
    monkeypatch.setattr(products, "_reorder", lambda w: made.append(tuple(w.shape)) or original(w))
    beam_search(decoder, torch.randn(2, 4, 8), SpecialTokens(1, 2), DecodeOptions(beam_size=3, max_length=6))
    assert len(made) == 10  # once each, not once a step: W_h, W_s, init h and c, gate, W_ih, W_hh, L_h, L_z, L_o
    beam_search(decoder, torch.randn(2, 4, 8), SpecialTokens(1, 2), DecodeOptions(beam_size=3, max_length=6))
    assert len(made) == 20


def test_sampling_with_gradients_reorders_each_weight_once_per_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCST's samples carry gradients: each step's forward products still share one reordered
    copy of each weight, the gradients still reach every layer."""
    needs_onednn()
    from captioner.models.decoding import DecodeOptions, SpecialTokens
    from captioner.models.decoding.sampling import sample_captions
    from captioner.models.decoders.lstm import LSTMConfig, LSTMDecoder

    torch.manual_seed(7)
    decoder = LSTMDecoder(LSTMConfig(embed_dim=6, hidden_dim=10, attention_dim=5), 30, 8).train()
    monkeypatch.setattr(products, "_ENABLED", True)
    made = []
    original = products._reorder
    monkeypatch.setattr(products, "_reorder", lambda w: made.append(tuple(w.shape)) or original(w))
    options = DecodeOptions(sample=True, n_best=3, max_length=6, seed=0)
    sampled = sample_captions(decoder, torch.randn(2, 4, 8), SpecialTokens(1, 2), options)
    assert len(made) == 10  # once each for the whole roll-out, not once a step
    sampled.logprobs.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in decoder.parameters())


def test_the_route_is_not_taken_where_it_does_not_apply(calls, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(4)
    layer = onednn_linear(nn.Linear(6, 4))
    x = torch.randn(3, 6)
    with torch.no_grad():
        layer.bfloat16()(x.bfloat16())  # bf16: torch's own route (oneDNN already)
        layer.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(x).dtype == torch.bfloat16  # autocast's cast, as layer(x) would
        traced = torch.jit.trace(layer, (x,), check_trace=False)  # the check would rerun it eagerly
        assert "mkldnn" not in str(traced.graph)  # an exported graph holds the plain op
        with torch.backends.mkldnn.flags(enabled=False):
            assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        products.set_onednn(False)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert calls == []
    products.set_onednn(True)
    with torch.no_grad():
        layer(x)
    assert calls == [(3, 6)]


def test_prepared_and_gram(route: str) -> None:
    torch.manual_seed(5)
    weight = torch.randn(30, 20)
    x = torch.randn(7, 20)
    torch.testing.assert_close(prepared(weight)(x), x @ weight.t(), **FP32)
    assert prepared(weight.t())(torch.randn(2, 30)).shape == (2, 20)
    a, b = torch.randn(50, 9), torch.randn(50, 13)
    torch.testing.assert_close(gram(a, b), a.t() @ b, **FP32)
    torch.testing.assert_close(gram(b, a), b.t() @ a, **FP32)
    torch.testing.assert_close(linear(x, weight), x @ weight.t(), **FP32)


def decoder_feat_dim(decoder: nn.Module) -> int:
    return decoder.grid_proj[0].in_features if hasattr(decoder, "grid_proj") else decoder.init_h.in_features


# --- the private ops failing, and layers that are not plain nn.Linear --------------------------------


def raises(*args, **kwargs):
    raise RuntimeError("mkldnn::_linear_pointwise: no such kernel")


def other_signature(x, packed):  # a later torch's op with other arguments
    return x @ packed.t()


def wrong_numbers(x, packed, bias, *rest):
    return torch.zeros(x.shape[0], packed.shape[0])


@pytest.mark.parametrize(
    ("op", "why"),
    [(None, "TypeError"), (raises, "RuntimeError: mkldnn::_linear_pointwise: no such kernel"),
     (other_signature, "TypeError"),
     (wrong_numbers, "gave other numbers than F.linear")],
    ids=["missing", "raising", "other-signature", "wrong-numbers"],
)
def test_a_failing_route_falls_back_at_its_first_use_with_one_line(op, why: str, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(products, "_INNER_PRODUCT", op)
    monkeypatch.setattr(products, "_REORDER", getattr(products, "_REORDER") or (lambda w: w))
    monkeypatch.setattr(products, "_ENABLED", True)
    monkeypatch.setattr(products, "_CHECKED", False)
    torch.manual_seed(8)
    layer, x = onednn_linear(nn.Linear(12, 7)), torch.randn(4, 12, requires_grad=True)
    with caplog.at_level("WARNING", logger="captioner.models.products"):
        for _ in range(3):
            got = layer(x)
            torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))
            got.sum().backward()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and why in lines[0] and lines[0].endswith("dense layers use F.linear")
    assert not products._ENABLED


def test_the_route_passes_its_check_where_the_ops_work(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    needs_onednn()
    monkeypatch.setenv("CAPTIONER_ONEDNN", "1")  # the check alone, not the speed measurement (tested below)
    monkeypatch.setattr(products, "_ENABLED", True)
    monkeypatch.setattr(products, "_CHECKED", False)
    with caplog.at_level("WARNING", logger="captioner.models.products"):
        onednn_linear(nn.Linear(12, 3))(torch.randn(2, 12))
    assert products._ENABLED and products._CHECKED and not caplog.records


@pytest.mark.parametrize("taken", [True, False], ids=["onednn", "f_linear"])
def test_a_resumption_takes_the_route_its_checkpoint_was_trained_with(taken: bool, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    needs_onednn()
    monkeypatch.delenv("CAPTIONER_ONEDNN", raising=False)
    monkeypatch.setattr(products, "_ENABLED", not taken)  # the local decision: the other route
    with caplog.at_level("INFO", logger="captioner.models.products"):
        products.take_route(taken, "runs/x/last.pt")
    assert products.route_taken() is taken
    assert [r.getMessage() for r in caplog.records] == [
        (f"products: {'oneDNN' if taken else 'F.linear'}, the route runs/x/last.pt was trained with (this machine "
         "alone would take the other)")
    ]


@pytest.mark.parametrize("taken", [True, False], ids=["onednn", "f_linear"])
def test_a_resumption_before_any_product_takes_the_route_without_timing_either(
    taken: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint has decided: no product of SHAPE is timed, on a machine that keeps no decision."""
    needs_onednn()
    monkeypatch.delenv("CAPTIONER_ONEDNN", raising=False)
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(products, "_CHECKED", False)
    monkeypatch.setattr(products, "_ENABLED", True)
    monkeypatch.setattr(products, "time_both", lambda *a, **k: pytest.fail("timed the two routes"))
    products.take_route(taken, "runs/x/last.pt")
    assert products.route_taken() is taken
    assert not (tmp_path / "machine.json").exists()


@pytest.mark.parametrize("setting", ["0", "1"])
def test_the_users_onednn_setting_outranks_the_checkpoints_route(setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPTIONER_ONEDNN", setting)
    monkeypatch.setattr(products, "_ENABLED", setting == "1" and products.onednn_enabled())
    before = products.route_taken()
    products.take_route(not before, "runs/x/last.pt")
    assert products.route_taken() is before


def test_a_checkpoints_onednn_route_that_fails_here_goes_on_with_f_linear_in_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("CAPTIONER_ONEDNN", raising=False)
    monkeypatch.setattr(products, "_INNER_PRODUCT", raises)
    monkeypatch.setattr(products, "_REORDER", getattr(products, "_REORDER") or (lambda w: w))
    monkeypatch.setattr(products, "_ENABLED", False)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    with caplog.at_level("INFO", logger="captioner.models.products"):
        products.take_route(True, "runs/x/last.pt")
    assert not products.route_taken()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "runs/x/last.pt was trained with oneDNN's products" in lines[0]
    assert "no such kernel" in lines[0] and lines[0].endswith("it goes on with F.linear, not bit for bit")


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_hooks_see_every_call_of_a_decoders_layers(kind: str, route: str) -> None:
    """A forward hook on a decoder's dense layer (a probe, an adapter's) runs on every call the
    decoder makes, as it would with layer(x)."""

    model = tiny_model(f"model.decoder.type={kind}").eval()
    layer = model.decoder.out_vocab if kind == "lstm" else model.decoder.out
    seen = []
    handle = layer.register_forward_hook(lambda module, inputs, output: seen.append(tuple(output.shape)))
    feats = torch.randn(2, 16, decoder_feat_dim(model.decoder))
    with torch.no_grad():
        model.decoder(feats, torch.ones(2, 5, dtype=torch.long))
    handle.remove()
    assert seen and seen[0][-1] == len(model.vocab)


def test_quantize_dynamic_replaces_the_layers_the_decoder_uses(route: str) -> None:
    """`quantize_dynamic` swaps nn.Linear for its int8 copy: the decoder must run that copy."""

    model = tiny_model("model.decoder.type=lstm").eval()
    decoder = model.decoder
    feats, tokens = torch.randn(2, 16, decoder_feat_dim(decoder)), torch.ones(2, 5, dtype=torch.long)
    with torch.no_grad():
        plain = decoder(feats, tokens).logits  # (2, 5, V)
        quantized = torch.ao.quantization.quantize_dynamic(decoder, {nn.Linear}, dtype=torch.qint8)
        assert type(quantized.out_vocab) is not nn.Linear
        got = quantized(feats, tokens).logits  # (2, 5, V)
    assert not torch.equal(got, plain)  # int8 products ran
    torch.testing.assert_close(got, plain, atol=0.1, rtol=0.1)  # ... and approximate the fp32 ones


def test_the_step_by_step_forward_is_the_fused_one(route: str) -> None:
    """The LSTM's teacher forcing falls back to one `_advance` per step when its layers must run
    as modules: the same logits and maps as the fused forward, padding zero in both."""
    model = tiny_model("model.decoder.type=lstm", "model.decoder.dropout=0.0").eval()
    decoder = model.decoder
    feats, tokens = torch.randn(3, 16, decoder_feat_dim(decoder)), torch.randint(3, len(model.vocab), (3, 6))
    lengths = torch.tensor([6, 4, 2])
    with torch.no_grad():
        fused = decoder(feats, tokens, lengths)
        handle = decoder.gate.register_forward_hook(lambda *_: None)  # a hook: the layers must run as modules
        by_steps = decoder(feats, tokens, lengths)
        handle.remove()
    torch.testing.assert_close(by_steps.logits, fused.logits, **FP32)
    torch.testing.assert_close(by_steps.attn, fused.attn, **FP32)
    assert by_steps.logits[2, 2:].abs().sum() == 0


def test_attention_as_written_is_the_fused_attention() -> None:
    """With its score layer hooked, additive attention scores with tanh and the layer as a
    module: the same weights and context as the sigmoid-fused path, for B and B*K rows."""
    from captioner.models.attention import AdditiveAttention

    torch.manual_seed(9)
    attention = AdditiveAttention(8, 6, 5)
    feats, state = torch.randn(2, 7, 8), torch.randn(6, 6)
    with torch.no_grad():
        projected = attention.project(feats)
        fused = [attention(feats, projected, state[:2]), attention(feats, projected, state)]  # R = B, R = B*3
        handle = attention.score.register_forward_hook(lambda *_: None)
        written = [attention(feats, projected, state[:2]), attention(feats, projected, state)]
        handle.remove()
    for (c1, w1), (c2, w2) in zip(fused, written):
        torch.testing.assert_close(c2, c1, **FP32)
        torch.testing.assert_close(w2, w1, **FP32)


# --- the route taken where it is measured faster (once per machine) ---------------------------------


def test_the_route_is_measured_once_per_machine_and_kept(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from captioner.core import machine_cache

    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    measured = []
    monkeypatch.setattr(products, "time_both", lambda: measured.append(1) or (0.004, 0.009))
    monkeypatch.setattr(products, "time_grams", lambda: (0.002, 0.001))
    monkeypatch.setattr(products, "time_input_grads", lambda: (0.003, 0.001))
    with caplog.at_level("DEBUG", logger="captioner.models.products"):  # the timings: a diagnostic
        assert products.faster_here() is True
    assert "4.00 ms through oneDNN, 9.00 ms through F.linear" in caplog.records[-1].getMessage()
    assert "an input gradient 3.00 ms through oneDNN, 1.00 ms by torch.mm" in caplog.records[-1].getMessage()
    assert machine_cache.recall(products.CALIBRATION) == {"onednn": True, "onednn_ms": 4.0, "linear_ms": 9.0,
                                                          "gram_mm": True, "gram_onednn_ms": 2.0, "gram_mm_ms": 1.0,
                                                          "grad_mm": True, "grad_onednn_ms": 3.0, "grad_mm_ms": 1.0}
    monkeypatch.setattr(products, "time_both", lambda: measured.append(2) or (0.009, 0.004))
    assert products.faster_here() is True and measured == [1]  # the kept decision, not a new measurement
    (tmp_path / machine_cache.FILE_NAME).write_text("{not json")  # a corrupt file is measured anew
    assert products.faster_here() is False and measured == [1, 2]
    monkeypatch.setattr(products, "time_both", lambda: (0.0098, 0.0100))  # 2% is not worth a private op
    (tmp_path / machine_cache.FILE_NAME).unlink()
    assert products.faster_here() is False


def test_a_machine_cache_nested_past_pythons_limit_is_measured_anew(tmp_path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged ~/.cache/captioner file of lists 100,000 deep was a RecursionError's traceback at every command."""
    from captioner.core import machine_cache

    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    (tmp_path / machine_cache.FILE_NAME).write_text("[" * 100_000)
    assert machine_cache.recall("anything") is None


def test_kernels_held_to_an_instruction_set_are_another_machine(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ATEN_CPU_CAPABILITY=avx2 (and oneDNN's, MKL's like it) changes both the speed a decision measured and the
    last bits of a result: what was kept under the processor's own kernels is not recalled, nor the reverse."""
    from captioner.core import machine_cache

    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    for name in machine_cache.KERNEL_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    own = machine_cache.machine_key()
    machine_cache.remember("a decision", "own kernels")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", " avx2 ")
    assert machine_cache.machine_key() == f"{own} | ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2"
    assert machine_cache.recall("a decision") is None
    machine_cache.remember("a decision", "AVX2 kernels")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "")  # set empty: torch's default, as unset
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert machine_cache.machine_key() == own and machine_cache.recall("a decision") == "own kernels"


def test_processes_that_ask_together_take_one_decision(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's ranks start together with nothing kept. Were each to measure for itself, a close
    call (a few hundredths of a ms apart) could send them different routes, the last one written
    would win, and a resumed run would read a route one of the ranks had not taken (other bits in
    its resumed weights). The first to ask measures; the others wait and read its decision. Threads
    stand in for the processes: each opens the lock file itself."""
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    calls = []

    def close_call() -> tuple[float, float]:  # each measurement lands on the other side of 5%
        calls.append(1)
        time.sleep(0.2)  # the others ask meanwhile
        return (0.004, 0.009) if len(calls) % 2 else (0.009, 0.004)

    monkeypatch.setattr(products, "time_both", close_call)
    monkeypatch.setattr(products, "time_grams", lambda: (0.002, 0.001))
    monkeypatch.setattr(products, "time_input_grads", lambda: (0.002, 0.001))
    with ThreadPoolExecutor(4) as pool:
        routes = list(pool.map(lambda _: products.faster_here(), range(4)))
    assert routes == [True] * 4 and len(calls) == 1


def test_an_unwritable_cache_only_costs_the_measurement(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(blocker / "cache"))  # a folder inside a file: cannot be made
    monkeypatch.setattr(products, "time_both", lambda: (0.004, 0.009))
    monkeypatch.setattr(products, "time_grams", lambda: (0.002, 0.001))
    monkeypatch.setattr(products, "time_input_grads", lambda: (0.002, 0.001))
    assert products.faster_here() is True


@pytest.mark.parametrize(("setting", "measures", "route"), [("1", False, True), ("", True, False)])
def test_onednn_1_takes_the_route_without_measuring(setting: str, measures: bool, route: bool, tmp_path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    needs_onednn()
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CAPTIONER_ONEDNN", setting)
    measured = []
    monkeypatch.setattr(products, "time_both", lambda: measured.append(1) or (0.010, 0.009))  # slower here
    monkeypatch.setattr(products, "time_grams", lambda: (0.002, 0.001))
    monkeypatch.setattr(products, "time_input_grads", lambda: (0.002, 0.001))
    monkeypatch.setattr(products, "_ENABLED", True)
    monkeypatch.setattr(products, "_CHECKED", False)
    onednn_linear(nn.Linear(12, 3))(torch.randn(2, 12))
    assert bool(measured) is measures and products._ENABLED is route


def test_the_route_is_timed_on_the_models_shapes_each_with_its_bias(monkeypatch: pytest.MonkeyPatch) -> None:
    """One 160x512 by 512x2048 product without a bias was a tie under AVX2 (2.14 against 2.10 ms) where the
    models' products, each with a bias and the output projection to 10,000 words among them, win by 10-85%:
    the calibration times each shape of SHAPES with its bias, both ways, and sums them."""
    needs_onednn()
    seen: list[tuple[str, tuple[int, ...], tuple[int, ...] | None]] = []
    inner, f_linear = products._product, F.linear

    def through_onednn(x, packed, bias):
        seen.append(("onednn", tuple(x.shape), None if bias is None else tuple(bias.shape)))
        return inner(x, packed, bias)

    def plain_linear(x, weight, bias=None):
        seen.append(("F.linear", tuple(x.shape) + tuple(weight.shape), None if bias is None else tuple(bias.shape)))
        return f_linear(x, weight, bias)

    monkeypatch.setattr(products, "_product", through_onednn)
    monkeypatch.setattr(products.F, "linear", plain_linear)
    products.time_both(rounds=1, repeats=1)
    assert (96, 512, 10000) in products.SHAPES
    want = {("onednn", (m, k), (n,)) for m, k, n in products.SHAPES}
    want |= {("F.linear", (m, k, n, k), (n,)) for m, k, n in products.SHAPES}
    assert set(seen) == want
    times = iter([0.002, 0.0021, 0.006, 0.009])  # a tie on the step's product, a win on the output projection
    monkeypatch.setattr(products, "_fastest", lambda candidates, rounds, repeats: [next(times) for _ in candidates])
    assert products.time_both() == pytest.approx((0.008, 0.0111))


def test_time_both_measures_both_routes() -> None:
    needs_onednn()
    onednn, plain_linear = products.time_both(rounds=1, repeats=2)
    assert 0 < onednn < 1 and 0 < plain_linear < 1
    gram_onednn, gram_mm = products.time_grams(rounds=1, repeats=1)
    assert 0 < gram_onednn < 1 and 0 < gram_mm < 1
    grad_onednn, grad_mm = products.time_input_grads(rounds=1, repeats=1)
    assert 0 < grad_onednn < 1 and 0 < grad_mm < 1


# --- weight gradients: through oneDNN, or by torch.mm where that is measured faster -------------------


@pytest.mark.parametrize("by_mm", [True, False], ids=["torch.mm", "onednn"])
def test_a_weight_gradient_is_the_product_the_decision_names_bit_for_bit(by_mm: bool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    needs_onednn()
    monkeypatch.setattr(products, "_ENABLED", True)
    monkeypatch.setattr(products, "_GRAM_MM", by_mm)
    torch.manual_seed(6)
    a, b = torch.randn(300, 24), torch.randn(300, 40)  # (M, P), (M, Q)
    assert products.gram_by_mm() is by_mm
    for x, y in ((a, b), (b, a)):  # either operand the narrower
        expected = x.t() @ y if by_mm else products._onednn_gram(x, y)
        assert torch.equal(gram(x, y), expected)
    layer, inputs = onednn_linear(nn.Linear(24, 40)), torch.randn(300, 24)
    layer(inputs).pow(2).sum().backward()  # the layer's weight gradient: g^T x
    g = 2 * F.linear(inputs, layer.weight, layer.bias).detach()  # (M, 40)
    torch.testing.assert_close(layer.weight.grad, g.t() @ inputs, **FP32)


@pytest.mark.parametrize(("key", "timing"), [("gram_mm", "time_grams"), ("grad_mm", "time_input_grads")],
                         ids=["weight", "input"])
@pytest.mark.parametrize(("times", "by_mm"), [((0.010, 0.004), True), ((0.010, 0.0098), False),
                                              ((0.004, 0.010), False)], ids=["mm-faster", "within-5%", "slower"])
def test_gradients_go_by_torch_mm_only_where_it_wins_by_5_percent(key: str, timing: str, times, by_mm: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(products, "time_both", lambda: (0.004, 0.009))
    for name in ("time_grams", "time_input_grads"):  # the other gradient's two ways: a tie, oneDNN kept
        monkeypatch.setattr(products, name, (lambda: times) if name == timing else (lambda: (0.002, 0.002)))
    decision = products.measure_route()
    other = "grad_mm" if key == "gram_mm" else "gram_mm"
    assert decision["onednn"] is True and decision[key] is by_mm and decision[other] is False


@pytest.mark.parametrize("by_mm", [True, False], ids=["torch.mm", "onednn"])
def test_an_input_gradient_is_the_product_the_decision_names_bit_for_bit(by_mm: bool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    needs_onednn()
    monkeypatch.setattr(products, "_ENABLED", True)
    monkeypatch.setattr(products, "_GRAD_MM", by_mm)
    assert products.grad_by_mm() is by_mm
    torch.manual_seed(7)
    layer, inputs = onednn_linear(nn.Linear(24, 40)), torch.randn(3, 100, 24, requires_grad=True)  # (..., K)
    layer(inputs).pow(2).sum().backward()
    g = 2 * F.linear(inputs, layer.weight, layer.bias).detach().reshape(-1, 40)  # (M, N): the output's gradient
    weight = layer.weight.detach()  # (N, K)
    expected = g @ weight if by_mm else products._product(g, products._reorder(weight.t()), None)  # (M, K)
    assert inputs.grad.shape == (3, 100, 24)
    assert torch.equal(inputs.grad.reshape(-1, 24), expected)
    torch.testing.assert_close(inputs.grad.reshape(-1, 24), g @ weight, **FP32)  # either way, g W


@pytest.mark.parametrize(("kept", "key"), [
    ({"onednn": True, "onednn_ms": 4.0, "linear_ms": 9.0}, "gram_mm"),
    ({"onednn": True, "onednn_ms": 4.0, "linear_ms": 9.0, "gram_mm": False, "gram_onednn_ms": 1.0, "gram_mm_ms": 2.0},
     "grad_mm"),
], ids=["before-weight-gradients", "before-input-gradients"])
def test_a_kept_decision_without_a_gradient_choice_is_measured_anew(kept: dict, key: str, tmp_path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from captioner.core import machine_cache

    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    machine_cache.remember(products.CALIBRATION, kept)  # an older decision, from before the choice
    monkeypatch.setattr(products, "time_both", lambda: (0.004, 0.009))
    monkeypatch.setattr(products, "time_grams", lambda: (0.010, 0.004))
    monkeypatch.setattr(products, "time_input_grads", lambda: (0.010, 0.004))
    assert products.decided_here()[key] is True
    assert machine_cache.recall(products.CALIBRATION)[key] is True


@pytest.mark.parametrize("recorded", [True, False, None], ids=["torch.mm", "onednn", "not-recorded"])
@pytest.mark.parametrize("key", ["gram_mm", "grad_mm"], ids=["weight", "input"])
def test_a_resumption_takes_its_checkpoints_gradient_products(recorded: bool | None, key: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from captioner.training.speed import SpeedChoices, decide_steps

    needs_onednn()
    monkeypatch.delenv("CAPTIONER_ONEDNN", raising=False)
    monkeypatch.setattr(products, "_ENABLED", True)
    monkeypatch.setattr(products, f"_{key.upper()}", not recorded)  # this process's own decision: the other
    saved = {"onednn_products": True, "cpu_bf16": False, **({} if recorded is None else {key: recorded})}
    config = tiny_config()
    ctx = type("Ctx", (), {"device": torch.device("cpu"), "is_main": True, "enabled": False})()
    _, onednn, gram_mm, grad_mm = decide_steps(config, ctx, None, False, None, saved, "runs/x/last.pt")
    by_mm = gram_mm if key == "gram_mm" else grad_mm
    assert onednn is True and by_mm is bool(recorded)  # a checkpoint from before the choice: oneDNN's
    assert SpeedChoices(False, 1, onednn, gram_mm, grad_mm).to_dict()[key] is bool(recorded)


def test_the_route_knows_when_an_onnx_export_is_under_way(tmp_path: Path) -> None:
    """The route stays out of an ONNX export (its oneDNN product has no ONNX form), and asks without
    loading torch.onnx when nothing has loaded it: no export can then be under way."""
    require_module("onnx", "the onnx extra is not installed (pip install -e .[onnx])")
    seen: list[bool] = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(products.exporting_onnx())
            return x + 1  # (2,)

    assert not products.exporting_onnx()
    torch.onnx.export(Probe(), (torch.zeros(2),), str(tmp_path / "probe.onnx"), dynamo=False)
    assert seen and all(seen)
    assert not products.exporting_onnx()
