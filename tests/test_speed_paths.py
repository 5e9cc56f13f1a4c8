"""The fast paths give the numbers of the straightforward ones: the LSTM's teacher-forced forward
against its own `step` run word by word (values and gradients), fused self-attention against
the explicit softmax, and the thread knob's precedence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import warm_start
from torch.utils._python_dispatch import TorchDispatchMode
from helpers import subprocess_env, tiny_config, tiny_model

from captioner.core import process_settings
from captioner.core.config import load_config
from captioner.core.errors import ConfigError
from captioner.core.process_settings import ENV_THREADS, resolve_threads, set_threads
from captioner.data.batching import CaptionBatch
from captioner.models import products
from captioner.models.attention import MultiHeadAttention
from captioner.models.decoder import Decoder
from captioner.models.decoders.lstm import LSTMConfig, LSTMDecoder, RecurrentProduct, active_rows
from captioner.models.decoders.transformer import TransformerConfig, TransformerDecoder
from captioner.training.loop import caption_loss


def stepwise_logits(decoder: LSTMDecoder, feats: torch.Tensor, tokens: torch.Tensor,
                    lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain computation: every row run alone through `_advance`, one word at a time."""
    logits = torch.zeros(*tokens.shape, decoder.vocab_size)
    attn = torch.zeros(*tokens.shape, feats.shape[1])
    for b, n in enumerate(lengths):
        memory = decoder.prepare(feats[b : b + 1])
        state = decoder.init_state(memory)
        for t in range(n):
            out, weights, state = decoder._advance(memory, decoder.embedding(tokens[b : b + 1, t]), state)
            logits[b, t], attn[b, t] = out[0], weights[0]
    return logits, attn


@pytest.mark.parametrize("lengths", [[7, 7, 5, 2, 1], [7, 7, 7, 7, 7]], ids=["padded", "full"])
def test_lstm_forward_equals_stepwise_values_and_gradients(lengths: list[int]) -> None:
    torch.manual_seed(0)
    decoder = LSTMDecoder(LSTMConfig(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.0), 23, 10)
    feats = torch.randn(5, 9, 10)
    tokens = torch.randint(0, 23, (5, 7))
    fast = decoder(feats, tokens, torch.tensor(lengths))
    slow_logits, slow_attn = stepwise_logits(decoder, feats, tokens, lengths)
    torch.testing.assert_close(fast.logits, slow_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.attn[:, :, 0, 0], slow_attn, atol=1e-6, rtol=1e-6)

    feats.requires_grad_()  # the encoder learns through the grid's gradient

    def grads(logits: torch.Tensor) -> list[torch.Tensor]:
        decoder.zero_grad()
        feats.grad = None
        (logits * torch.linspace(-1, 1, logits.numel()).view_as(logits)).sum().backward()
        return [p.grad.clone() for p in decoder.parameters()] + [feats.grad.clone()]

    fast_grads = grads(decoder(feats, tokens, torch.tensor(lengths)).logits)
    slow_grads = grads(stepwise_logits(decoder, feats, tokens, lengths)[0])
    names = [name for name, _ in decoder.named_parameters()] + ["feats"]
    for name, f, s in zip(names, fast_grads, slow_grads, strict=True):
        torch.testing.assert_close(f, s, atol=1e-5, rtol=1e-4, msg=name)


class CreatedTensors(TorchDispatchMode):
    """The shapes of the tensors that zero-filling ops create."""

    ZEROS = {torch.ops.aten.zeros.default, torch.ops.aten.new_zeros.default, torch.ops.aten.slice_backward.default,
             torch.ops.aten.zero_.default}

    def __init__(self) -> None:
        super().__init__()
        self.zero_filled: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func in self.ZEROS:
            self.zero_filled.append(tuple(out.shape))
        return out


def test_lstm_backward_zero_fills_the_grids_gradient_once_whatever_the_lengths() -> None:
    """Captions that end at 3 different steps: the grid's features get one zero-filled gradient,
    not one per length (each a copy of the rows above it), and its projection none (the steps'
    gradients are summed, `RecurrentAttention`)."""
    torch.manual_seed(0)
    decoder = LSTMDecoder(LSTMConfig(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.0), 23, 10)
    feats = torch.randn(5, 9, 10, requires_grad=True)
    logits = decoder(feats, torch.randint(0, 23, (5, 7)), torch.tensor([7, 7, 5, 2, 1])).logits
    with CreatedTensors() as created:
        logits.sum().backward()
    grid_sized = [shape for shape in created.zero_filled if len(shape) == 3 and shape[1] == 9]
    assert sorted(grid_sized) == [(5, 9, 10)]


@pytest.mark.parametrize("onednn", [False, True], ids=["torch-products", "onednn-products"])
def test_recurrent_product_gives_autograds_gradients(onednn: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its weight gradient (one product after the last step) and input gradients are autograd's,
    with rows dropping out along the way, again on a second backward of the same graph; no
    gradient: the plain product. With torch's products the same to rounding; through oneDNN
    (another fp32 summation order, amplified by four saturating tanh steps) to 1e-4."""
    monkeypatch.setattr(products, "_ENABLED", onednn and products.onednn_enabled())
    tol = {"atol": 1e-5, "rtol": 1e-4} if onednn else {"atol": 1e-6, "rtol": 1e-5}
    torch.manual_seed(3)
    weight = torch.randn(6, 5, requires_grad=True)
    start = torch.randn(4, 6, requires_grad=True)
    back = torch.randn(5, 6)

    def run(product: RecurrentProduct | None, backwards: int = 1) -> list[torch.Tensor]:
        weight.grad = start.grad = None
        x, loss = start, torch.zeros(())
        for rows in (4, 4, 3, 1):
            y = product(x[:rows]) if product is not None else x[:rows] @ weight  # (rows, 5)
            x = torch.tanh(y @ back)  # (rows, 6)
            loss = loss + (x * torch.linspace(-1, 1, x.numel()).view_as(x)).sum()
        for _ in range(backwards):
            loss.backward(retain_graph=True)
        return [weight.grad.clone(), start.grad.clone()]

    plain = run(None)
    for got, want in zip(run(RecurrentProduct(weight)), plain):
        torch.testing.assert_close(got, want, **tol)
    for got, want in zip(run(RecurrentProduct(weight), backwards=2), plain):
        torch.testing.assert_close(got, 2 * want, **tol)
    with torch.no_grad():
        assert not RecurrentProduct(weight).deferred
        x = torch.randn(2, 6)
        torch.testing.assert_close(RecurrentProduct(weight)(x), x @ weight, **tol)


def test_lstm_padding_outputs_are_zero() -> None:
    torch.manual_seed(1)
    decoder = LSTMDecoder(LSTMConfig(embed_dim=4, hidden_dim=5, attention_dim=3), 11, 4).eval()
    out = decoder(torch.randn(3, 4, 4), torch.randint(0, 11, (3, 6)), torch.tensor([4, 2, 2]))
    assert (out.logits[:, 4:] == 0).all() and (out.logits[1:, 2:] == 0).all()
    assert (out.logits[0, :4] != 0).any(dim=-1).all()
    torch.testing.assert_close(out.attn[0, :4].sum(-1), torch.ones(4, 1, 1))
    empty = decoder(torch.randn(2, 4, 4), torch.randint(0, 11, (2, 3)), torch.tensor([0, 0]))
    assert empty.logits.shape == (2, 3, 11) and not empty.logits.any() and empty.attn.shape == (2, 3, 1, 1, 4)



def tiny_decoder(kind: str) -> Decoder:
    torch.manual_seed(0)
    if kind == "lstm":
        return LSTMDecoder(LSTMConfig(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.0), 23, 10)
    return TransformerDecoder(TransformerConfig(d_model=16, num_layers=2, num_heads=4, ff_dim=32, dropout=0.0), 23, 10)


def gradients(decoder: Decoder, feats: torch.Tensor, loss: torch.Tensor) -> list[torch.Tensor]:
    """Every parameter's gradient and the grid's, of `loss`."""
    decoder.zero_grad()
    feats.grad = None
    loss.backward()
    return [p.grad.clone() for p in decoder.parameters() if p.grad is not None] + [feats.grad.clone()]


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_teacher_forcing_prepares_each_image_once_with_the_numbers_of_a_grid_per_caption(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five captions of two images: the per-image constants (the LSTM's projected grid and first
    state, the transformer's keys and values) are computed over the 2 images, not the 5
    captions, and logits, maps and gradients are those of each caption given its own copy."""
    decoder = tiny_decoder(kind)
    feats = torch.randn(2, 9, 10, requires_grad=True)
    tokens = torch.randint(0, 23, (5, 7))
    lengths, image_rows = torch.tensor([7, 6, 6, 3, 1]), torch.tensor([1, 0, 1, 0, 0])
    prepared_rows = []
    prepare = decoder.prepare
    monkeypatch.setattr(decoder, "prepare", lambda grid: prepared_rows.append(grid.shape[0]) or prepare(grid))
    once = decoder(feats, tokens, lengths, image_rows=image_rows)
    assert prepared_rows == [2]
    copied = decoder(feats.index_select(0, image_rows), tokens, lengths)
    torch.testing.assert_close(once.logits, copied.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(once.attn, copied.attn, atol=1e-6, rtol=1e-6)
    weighting = torch.linspace(-1, 1, once.logits.numel()).view_as(once.logits)  # (C, T, V)
    got, want = gradients(decoder, feats, (once.logits * weighting).sum()), gradients(decoder, feats,
                                                                                      (copied.logits * weighting).sum())
    for got, want in zip(got, want, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_packed_logits_are_the_real_positions_of_the_padded_ones(kind: str) -> None:
    decoder = tiny_decoder(kind)
    feats = torch.randn(4, 9, 10, requires_grad=True)
    tokens = torch.randint(0, 23, (4, 7))
    lengths = torch.tensor([7, 5, 2, 1])
    padded = decoder(feats, tokens, lengths)
    packed = decoder(feats, tokens, lengths, packed=True)
    real = (torch.arange(7)[None, :] < lengths[:, None]).flatten()  # (C*T,)
    assert packed.positions is not None and packed.logits.shape == (int(lengths.sum()), 23)
    assert sorted(packed.positions.tolist()) == real.nonzero().squeeze(1).tolist()
    torch.testing.assert_close(packed.logits, padded.logits.flatten(0, 1)[packed.positions], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.attn, padded.attn)
    weighting = torch.linspace(-1, 1, real.numel() * 23).view(-1, 23)  # (C*T, V): one weight per logit
    want = gradients(decoder, feats, (padded.logits.flatten(0, 1)[real] * weighting[real]).sum())
    got = gradients(decoder, feats, (packed.logits * weighting[packed.positions]).sum())
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    assert decoder(feats, tokens, None, packed=True).positions is None  # no lengths: nothing to skip



def value_bucket_pick(allowed: torch.Tensor) -> torch.Tensor:
    """A deterministic pick that is not the argmax: one of each row's top 3 words, chosen by the
    size of its best log-probability, so that a tiny random decoder's captions end at many
    different steps (its argmax captions end at once or never)."""
    which = (allowed.max(dim=-1).values * 37).floor().long() % 3  # (R,)
    return allowed.topk(3, dim=-1).indices.gather(1, which[:, None]).squeeze(1)  # (R,)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("constrained", [False, True])
def test_the_shrinking_roll_out_gives_the_static_ones_numbers_for_less_work(kind: str, constrained: bool,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU without gradients (SCST's sampling, its greedy baseline) the roll-out drops the
    rows that have ended and stops when none is left: the same words, log-probabilities and
    masks as the static loop, from fewer rows stepped."""
    from captioner.models.decoding import DecodeOptions, SpecialTokens
    from captioner.models.decoding.sampling import roll_out

    decoder = tiny_decoder(kind).eval()
    with torch.no_grad():
        # <eos> likely enough to end captions at many steps
        (decoder.out_vocab if kind == "lstm" else decoder.out).bias[2] = {"lstm": 1.0, "transformer": 2.0}[kind]
    torch.manual_seed(3)
    feats = torch.randn(24, 9, 10)  # (B, N, D)
    special = SpecialTokens(1, 2, (0, 1))
    options = DecodeOptions(max_length=12, block_trigrams=constrained, min_length=2 if constrained else 0)
    stepped = []
    step = decoder.step
    monkeypatch.setattr(decoder, "step",
                        lambda memory, prev, state: stepped.append(len(prev)) or step(memory, prev, state))

    def roll(grad: bool) -> tuple[torch.Tensor, ...]:
        stepped.clear()
        with torch.set_grad_enabled(grad):
            out = roll_out(decoder, decoder.prepare(feats), special, options, value_bucket_pick)
        return out.tokens, out.logprobs, out.mask

    tokens, logprobs, mask = roll(grad=True)  # (B, T) each: the static loop
    static_rows = sum(stepped)
    shrunk_tokens, shrunk_logprobs, shrunk_mask = roll(grad=False)
    lengths = mask.sum(dim=1)  # (B,)
    assert len(set(lengths.tolist())) >= 5 and int(lengths.max()) == 12  # they end at many steps, some never
    assert torch.equal(shrunk_tokens, tokens) and torch.equal(shrunk_mask, mask)
    torch.testing.assert_close(shrunk_logprobs, logprobs.detach(), atol=1e-5, rtol=1e-5)
    assert static_rows == 24 * 12 and len(stepped) == 12
    assert stepped == sorted(stepped, reverse=True) and stepped[-1] < 24  # rows left as they ended
    assert int(lengths.sum()) <= sum(stepped) < static_rows * 0.8  # every real position stepped, far fewer in all


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("groups", [1, 2])
def test_batched_beam_search_drops_the_done_images_and_finds_what_each_image_finds_alone(
    kind: str, groups: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU the images whose searches are done leave the batch's steps: every image's
    hypotheses (words, scores, maps, self-attention) are still those of its search run alone,
    and far fewer rows are stepped than the batch's beams times its steps."""
    from captioner.models.decoding import DecodeOptions, SpecialTokens, beam, beam_search_n_best

    decoder = tiny_decoder(kind).eval()
    with torch.no_grad():
        (decoder.out_vocab if kind == "lstm" else decoder.out).bias[2] = {"lstm": 1.0, "transformer": 4.0}[kind]
    torch.manual_seed(5)
    feats = torch.randn(12, 9, 10)  # (B, N, D)
    special = SpecialTokens(1, 2, (0, 1))
    options = DecodeOptions(
        beam_size=4 if groups > 1 else 3, diverse_groups=groups, n_best=2, max_length=12, length_penalty=0.5,
        block_trigrams=groups > 1, self_attention=kind == "transformer",
    )
    stepped: list[int] = []
    step = beam.step_decoder
    monkeypatch.setattr(beam, "step_decoder", lambda d, m, prev, *a: stepped.append(len(prev)) or step(d, m, prev, *a))

    def search(images: torch.Tensor) -> list[list]:
        stepped.clear()
        return beam_search_n_best(decoder, images, special, options)

    together = search(feats)
    together_stepped = list(stepped)  # rows per step
    alone_steps = []
    for b in range(12):
        alone = search(feats[b : b + 1])[0]
        alone_steps.append(len(stepped))
        assert [h.tokens for h in together[b]] == [h.tokens for h in alone], b
        assert [h.finished for h in together[b]] == [h.finished for h in alone], b
        for got, want in zip(together[b], alone, strict=True):
            assert got.score == pytest.approx(want.score, abs=1e-5)
            torch.testing.assert_close(got.attn, want.attn, atol=1e-5, rtol=1e-5)
            if want.self_attn is not None:
                torch.testing.assert_close(got.self_attn, want.self_attn, atol=1e-5, rtol=1e-5)
    K, steps = options.beam_size, len(together_stepped)
    assert len(set(alone_steps)) >= 3 and steps == max(alone_steps)  # the searches end at different steps
    assert together_stepped[:2] == [12, 12 * K] and together_stepped[1:] == sorted(together_stepped[1:], reverse=True)
    needed = sum(1 + K * (n - 1) for n in alone_steps)  # each image's own search; its first step is one row
    assert needed <= sum(together_stepped) < 0.9 * (12 + 12 * K * (steps - 1))  # static: every beam to the last step


@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_the_training_loss_of_packed_logits_is_the_cross_entropy_of_every_real_word(decoder: str) -> None:
    """`caption_loss` scores the decoder's packed logits against the right targets: the mean
    cross-entropy of every word (and <eos>) of every caption, as the padded logits give it."""
    overrides = (f"model.decoder.type={decoder}", "model.decoder.dropout=0.0", "train.attention_penalty=0")
    model, config = tiny_model(*overrides), tiny_config(*overrides)
    # (C, T+1)
    tokens = torch.tensor([[1, 4, 5, 7, 2, 0, 0], [1, 6, 8, 9, 4, 5, 2], [1, 4, 2, 0, 0, 0, 0], [1, 5, 6, 9, 2, 0, 0]])
    lengths = (tokens != model.vocab.pad_id).sum(dim=1)  # (C,) 5, 7, 3, 5: not sorted, as a loader may give them
    batch = CaptionBatch(torch.randn(2, 3, 32, 32), tokens, lengths, torch.tensor([1, 0, 1, 0]), torch.arange(2))
    loss, _ = caption_loss(model, batch, config, encoded=False)
    padded = model(batch.images, tokens[:, :-1], batch.image_rows).logits  # (C, T, V), every position run
    words = [(c, t) for c in range(4) for t in range(int(lengths[c]) - 1)]
    want = torch.stack([-padded[c, t].log_softmax(-1)[tokens[c, t + 1]] for c, t in words]).mean()
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)

class ProductFlops(TorchDispatchMode):
    """The multiply-adds of the matrix products run under it. A dispatch mode, not torch's
    FlopCounterMode: that one hooks every module, and a hooked layer sends the LSTM down its
    step-by-step path (`products.plain`)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        a, b = {torch.ops.aten.addmm.default: args[1:3], torch.ops.aten.mm.default: args[:2],
                torch.ops.aten.bmm.default: args[:2],
                torch.ops.aten.mv.default: args[:2]}.get(func, (None, None))
        if a is not None:
            self.total += a.numel() * (b.shape[-1] if b.dim() > 1 else 1)  # (..., m, k) @ (..., k, n): m k n per batch
        return out


def test_lstm_padding_costs_no_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The products of a padded batch, forward and backward, are those of its captions run one
    by one without padding: nothing is computed for the padding (a product's work is additive
    in its rows). torch's products, which the dispatcher sees."""
    monkeypatch.setattr(products, "_ENABLED", False)
    decoder = tiny_decoder("lstm")
    feats, tokens, lengths = torch.randn(3, 9, 10), torch.randint(0, 23, (3, 7)), [7, 3, 1]

    def work(grid: torch.Tensor, words: torch.Tensor, counts: list[int]) -> int:
        with ProductFlops() as counter:
            decoder(grid, words, torch.tensor(counts), packed=True).logits.sum().backward()
        return counter.total

    alone = sum(work(feats[c : c + 1], tokens[c : c + 1, :n], [n]) for c, n in enumerate(lengths))
    assert alone > 0 and work(feats, tokens, lengths) == alone

def test_active_rows() -> None:
    assert active_rows(None, 3, 4) == [3, 3, 3, 3]
    assert active_rows(torch.tensor([5, 3, 3, 1]), 4, 6) == [4, 3, 3, 1, 1]
    assert active_rows(torch.tensor([2, 2]), 2, 5) == [2, 2]
    with pytest.raises(ValueError, match="sorted"):
        active_rows(torch.tensor([1, 3]), 2, 3)


@pytest.mark.parametrize("masked", [False, True])
def test_fused_self_attention_equals_explicit(masked: bool) -> None:
    torch.manual_seed(2)
    mha = MultiHeadAttention(d_model=16, num_heads=4, dropout=0.1).eval()
    x = torch.randn(3, 5, 16, requires_grad=True)
    k, v = mha.keys_values(x)
    mask = torch.ones(5, 5, dtype=torch.bool).tril() if masked else None
    explicit, _ = mha.attend(x, k, v, mask)
    fused, _ = mha.attend(x, k, v, mask, fused=True)
    torch.testing.assert_close(fused, explicit, atol=1e-6, rtol=1e-5)
    (g_explicit,) = torch.autograd.grad(explicit.sum(), x, retain_graph=True)
    (g_fused,) = torch.autograd.grad(fused.sum(), x)
    torch.testing.assert_close(g_fused, g_explicit, atol=1e-5, rtol=1e-5)


def test_thread_knob_precedence(monkeypatch) -> None:
    monkeypatch.delenv(ENV_THREADS, raising=False)
    monkeypatch.setattr(process_settings, "usable_cores", lambda: 4)
    monkeypatch.setattr(process_settings, "other_runnable_processes", lambda: 0)
    assert resolve_threads(None) == 4  # an idle machine: every core
    monkeypatch.setattr(process_settings, "other_runnable_processes", lambda: 3)
    assert resolve_threads(None) == 1  # three others running: the one free core
    monkeypatch.setattr(process_settings, "other_runnable_processes", lambda: 9)
    assert resolve_threads(None) == 1  # overloaded: never fewer than one
    monkeypatch.setattr(process_settings, "other_runnable_processes", lambda: None)
    assert resolve_threads(None) == 4  # no /proc: all cores, as torch would
    monkeypatch.setenv(ENV_THREADS, "3")
    assert resolve_threads(None) == 3
    assert resolve_threads(2) == 2  # a run's own train.threads beats the environment
    monkeypatch.setenv(ENV_THREADS, "many")
    with pytest.raises(ConfigError, match=ENV_THREADS):
        resolve_threads(None)
    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_threads_config_key_is_validated() -> None:
    assert load_config(None, ["train.threads=2"]).train.threads == 2
    with pytest.raises(ConfigError, match="train.threads"):
        load_config(None, ["train.threads=-1"])


BENCH_GPU = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu.py"


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return warm_start.run([sys.executable, str(BENCH_GPU), *args], capture_output=True, text=True,
                          env=subprocess_env(**(env or {})))


def test_bench_gpu_without_cuda_says_so_in_one_line() -> None:
    result = run_script(env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "no CUDA GPU" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    cpu = run_script("--device", "cpu")  # a CPU run is only ever the labelled smoke test
    assert cpu.returncode != 0 and "--tiny" in cpu.stderr and "Traceback" not in cpu.stderr


def test_bench_gpu_tiny_cpu_smoke_runs_every_path(tmp_path: Path) -> None:
    """The GPU benchmark's code, end to end on tiny inputs: our training (fine-tuned encoder from
    JPEG files through the DataLoader, cached grids from host memory and held on the device), the SCST
    step with both baselines, the eager and compiled decoder step, beam search, and the reference's
    rows when its repository is available."""
    out = tmp_path / "bench.json"
    result = run_script("--device", "cpu", "--tiny", "--out", str(out), env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "NOT a GPU measurement" in result.stdout
    report = json.loads(out.read_text())
    ours = [r for r in report["training"] if r["who"] == "ours"]
    assert {(r["config"], r["encoder"]) for r in ours} == {
        (c, e) for c in ("coco_lstm_resnet101", "coco_transformer_resnet101")
        # the last: data.features_on_device
        for e in ("fine-tuned", "frozen, cached grids", "frozen, grids on the device")
    }
    batch = 2  # --tiny's data.batch_size: every timed step trains on exactly this many images
    for r in ours:  # the rates count what the steps did, over the time they took
        assert r["images_per_s"] * r["seconds_per_step"] == pytest.approx(batch)
        assert r["captions_per_s"] == pytest.approx(5 * r["images_per_s"])  # captions_per_image: all, five per image
        assert r["coco_epoch_hours"] == pytest.approx(113_287 / r["images_per_s"] / 3600)
        assert (f"| ours | {r['config']} | {r['encoder']} | {r['captions_per_s']:.1f} | {r['images_per_s']:.1f} "
                "|") in result.stdout
    assert {(r["config"], r["batch"]) for r in report["beam"] if r["who"] == "ours"} >= {("coco_lstm_resnet101", 2)}
    configs = {"coco_lstm_resnet101", "coco_transformer_resnet101"}
    assert {(r["config"], r["baseline"]) for r in report["scst"]} == {(c, b) for c in configs
                                                                      for b in ("greedy", "mean")}
    for r in report["scst"]:
        assert r["captions_per_s"] == pytest.approx(r["samples"] * r["images_per_s"]) and not r["sync_checked"]
        assert r["images_per_s"] * r["seconds_per_step"] == pytest.approx(batch)
        assert f"| {r['config']} | {r['baseline']} | {r['samples']} | {r['captions_per_s']:.1f} |" in result.stdout
    for r in report["step"]:
        assert r["rows"] == 1 and r["ms_per_step"] > 0  # --tiny: 3/4 of the largest batch (2), as integer rows
        assert f"| {r['step']} | {r['config']} | {r['rows']} | {r['ms_per_step']:.2f} |" in result.stdout
    # no CUDA graphs here
    assert {(r["config"], r["step"]) for r in report["step"]} == {(c, s) for c in configs
                                                                  for s in ("eager", "compiled")}
    if "reference not available" not in result.stdout:
        assert {r["encoder"] for r in report["training"] if r["who"] == "reference"} == {"fine-tuned",
                                                                                         "frozen, cached grids"}
