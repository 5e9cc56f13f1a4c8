"""The dense layers' products through oneDNN (`captioner.models.products`): the numbers of
`F.linear` and autograd to fp32 rounding, the route really taken where it applies and not where
it does not, and a weight reordered once per decoding loop and anew in the next."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from captioner.models import products
from captioner.models.products import dense, gram, linear, prepared, reused_weights

pytestmark = pytest.mark.skipif(not products.onednn_enabled(), reason="this torch build has no oneDNN inner product")

FP32 = {"atol": 2e-5, "rtol": 1e-5}  # another summation order: fp32 rounding over a few hundred terms


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The input shape of every oneDNN product made, in order."""
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
def test_linear_gives_f_linear_through_onednn(shape, with_bias, calls) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape) if shape != (33, 7) else torch.randn(shape).t()  # (7, 33) with strides of its transpose
    layer = nn.Linear(33, 19, bias=with_bias)
    with torch.no_grad():
        got = dense(x, layer)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), **FP32)
    assert calls == [tuple(x.shape)]


@pytest.mark.parametrize("out_features", [9, 300], ids=["x-reordered", "gradient-reordered"])  # gram's two ways
def test_gradients_are_autograds(out_features: int, calls) -> None:
    torch.manual_seed(1)
    layer = nn.Linear(40, out_features)
    x = torch.randn(3, 11, 40, requires_grad=True)
    weights = torch.randn(3, 11, out_features)
    (dense(x, layer) * weights).sum().backward()
    got = [x.grad, layer.weight.grad, layer.bias.grad]
    assert len(calls) == 3  # forward, the input's gradient, the weight's gradient
    x.grad = layer.weight.grad = layer.bias.grad = None
    (F.linear(x, layer.weight, layer.bias) * weights).sum().backward()
    for g, want in zip(got, [x.grad, layer.weight.grad, layer.bias.grad]):
        torch.testing.assert_close(g, want, **FP32)


def test_a_frozen_layer_still_passes_its_input_gradient(calls) -> None:
    """Grad-CAM differentiates the output with respect to the features through frozen weights."""
    torch.manual_seed(2)
    layer = nn.Linear(8, 5).requires_grad_(False)
    x = torch.randn(4, 8, requires_grad=True)
    dense(x, layer).square().sum().backward()
    want = torch.autograd.grad(F.linear(x, layer.weight, layer.bias).square().sum(), x)[0]
    torch.testing.assert_close(x.grad, want, **FP32)
    assert layer.weight.grad is None


def test_weights_are_reordered_once_per_scope_and_anew_in_the_next(calls, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside `reused_weights` (a decoding loop) a weight is reordered once and reused; the next
    scope reorders it again, so a change between them is seen: a fused AdamW step, which changes
    the weights in place without bumping their version (a cache keyed on it went stale and
    scored the validation of a resumed run with old weights), and a load_state_dict."""
    torch.manual_seed(3)
    layer = nn.Linear(16, 12)
    x = torch.randn(5, 16)
    made = []
    original = products._reorder
    monkeypatch.setattr(products, "_reorder", lambda w: made.append(w.shape) or original(w))
    with torch.no_grad(), reused_weights():
        dense(x, layer), dense(x, layer)
        with reused_weights():  # nested: the outer copies serve
            dense(x, layer)
    assert len(made) == 1
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.5, fused=True)
    layer(x).square().sum().backward()
    version = layer.weight._version
    optimizer.step()
    assert layer.weight._version == version  # why the scope, not the version, decides
    other = nn.Linear(16, 12)
    with torch.no_grad():
        with reused_weights():
            torch.testing.assert_close(dense(x, layer), F.linear(x, layer.weight, layer.bias), **FP32)
        layer.load_state_dict(other.state_dict())
        with reused_weights():
            torch.testing.assert_close(dense(x, layer), other(x), **FP32)
        dense(x, layer), dense(x, layer)  # outside a scope: every call reorders
    assert len(made) == 5


def test_decoding_reorders_each_weight_once_per_search(monkeypatch: pytest.MonkeyPatch) -> None:
    from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search
    from captioner.models.lstm_decoder import LSTMDecoder

    torch.manual_seed(6)
    decoder = LSTMDecoder(vocab_size=30, feat_dim=8, embed_dim=6, hidden_dim=10, attention_dim=5).eval()
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
    from captioner.models.decoding import sample_captions
    from captioner.models.lstm_decoder import LSTMDecoder

    torch.manual_seed(7)
    decoder = LSTMDecoder(vocab_size=30, feat_dim=8, embed_dim=6, hidden_dim=10, attention_dim=5).train()
    monkeypatch.setattr(products, "_ENABLED", True)
    made = []
    original = products._reorder
    monkeypatch.setattr(products, "_reorder", lambda w: made.append(tuple(w.shape)) or original(w))
    sampled = sample_captions(decoder, torch.randn(2, 4, 8), 1, 2, n=3, max_length=6, generator=torch.Generator().manual_seed(0))
    assert len(made) == 10  # once each for the whole roll-out, not once a step
    sampled.logprobs.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in decoder.parameters())


class Dense(nn.Module):
    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense(x, self.layer)


def test_the_route_is_not_taken_where_it_does_not_apply(calls, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(4)
    layer = nn.Linear(6, 4)
    x = torch.randn(3, 6)
    with torch.no_grad():
        dense(x.bfloat16(), layer.bfloat16())  # bf16: torch's own route (oneDNN already)
        layer.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert dense(x, layer).dtype == torch.bfloat16  # autocast's cast, as layer(x) would
        traced = torch.jit.trace(Dense(layer), (x,), check_trace=False)  # the check would rerun it eagerly
        assert "mkldnn" not in str(traced.graph)  # an exported graph holds the plain op
        with torch.backends.mkldnn.flags(enabled=False):
            assert torch.equal(dense(x, layer), F.linear(x, layer.weight, layer.bias))
        products.set_onednn(False)
        assert torch.equal(dense(x, layer), F.linear(x, layer.weight, layer.bias))
    assert calls == []
    products.set_onednn(True)
    with torch.no_grad():
        dense(x, layer)
    assert calls == [(3, 6)]


def test_prepared_and_gram() -> None:
    torch.manual_seed(5)
    weight = torch.randn(30, 20)
    x = torch.randn(7, 20)
    torch.testing.assert_close(prepared(weight)(x), x @ weight.t(), **FP32)
    assert prepared(weight.t())(torch.randn(2, 30)).shape == (2, 20)
    a, b = torch.randn(50, 9), torch.randn(50, 13)
    torch.testing.assert_close(gram(a, b), a.t() @ b, **FP32)
    torch.testing.assert_close(gram(b, a), b.t() @ a, **FP32)
    torch.testing.assert_close(linear(x, weight), x @ weight.t(), **FP32)
