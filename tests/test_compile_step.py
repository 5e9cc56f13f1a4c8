"""The decoder step that beam search and self-critical training call compiles whole, once.

`torch.compile(decoder.step, fullgraph=True)` raises on any graph break (a `.item()`, a Python
branch on a tensor's value, an unsupported op), and a compile counter shows that N steps
compile one graph: the state's shapes never change, so nothing recompiles and the graph could
be replayed as a CUDA graph. The checks use the "aot_eager" backend (dynamo's capture and
AOTAutograd's functionalisation, the same graph inductor receives) to keep the test in
seconds on a small CPU; docs/results/bench_decoder_step.json has inductor's timings.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

from captioner.models.decoder import Decoder
from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search, greedy_decode
from captioner.models.decoders.lstm import LSTMConfig, LSTMDecoder
from captioner.models.decoders.transformer import TransformerConfig, TransformerDecoder

V, D, N, B = 13, 6, 9, 3  # vocabulary, feature dim, a 3x3 grid, rows
BOS, EOS = 1, 2
STEPS = 6


def make_decoder(kind: str) -> Decoder:
    torch.manual_seed(0)
    if kind == "lstm":
        decoder: Decoder = LSTMDecoder(LSTMConfig(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.0), V, D)
    else:
        decoder = TransformerDecoder(
            TransformerConfig(d_model=16, num_layers=2, num_heads=4, ff_dim=32, dropout=0.0), V, D)
    return decoder.eval()


def roll(step, decoder: Decoder, feats: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced `step` calls over tokens (B, T) -> logprobs (B, T, V), attn (B, T, L, H, N)."""
    memory = decoder.prepare(feats)
    state = decoder.init_state(memory, capacity=tokens.shape[1])
    logprobs, maps = [], []
    for t in range(tokens.shape[1]):
        lp, attn, state = step(memory, tokens[:, t], state)
        logprobs.append(lp)
        maps.append(attn)
    return torch.stack(logprobs, dim=1), torch.stack(maps, dim=1)  # (B, T, V), (B, T, L, H, N)


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(B, N, D, generator=g)  # (B, N, D)
    tokens = torch.randint(3, V, (B, STEPS), generator=g)  # (B, T)
    tokens[:, 0] = BOS
    return feats, tokens


def transformer_after(
    steps: int, capacity: int
) -> tuple[TransformerDecoder, torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The tiny transformer with its inputs, memory and the state after `steps` teacher-forced steps."""
    decoder = make_decoder("transformer")
    assert isinstance(decoder, TransformerDecoder)
    feats, tokens = inputs()
    memory = decoder.prepare(feats)
    state = decoder.init_state(memory, capacity=capacity)
    for t in range(steps):
        _, _, state = decoder.step(memory, tokens[:, t], state)
    return decoder, feats, tokens, memory, state


def reset_dynamo() -> None:
    """torch._dynamo.reset(). Its loop over the cached backends fails ("dictionary changed size during
    iteration") when resetting one registers another: a shuffled run met it after an earlier test of the process
    had made GraphedStep's reduce-overhead backends. A second pass finds every backend registered."""
    try:
        torch._dynamo.reset()
    except RuntimeError as e:
        if "dictionary changed size" not in str(e):
            raise
        torch._dynamo.reset()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    reset_dynamo()
    counters.clear()
    yield
    reset_dynamo()


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "with_grad"])
def test_step_compiles_once_without_graph_breaks_and_matches_eager(kind: str, grad: bool) -> None:
    """no_grad is beam search and greedy decoding: one graph for every step. With gradients,
    self-critical sampling: the transformer's first step gets a graph of its own, because its
    empty cache is not yet part of the autograd graph (dynamo guards on requires_grad), and every
    later step shares the second; the gradients through N compiled steps must equal eager ones
    (a cache written in place would fail backward)."""
    decoder = make_decoder(kind)
    feats, tokens = inputs()
    compile_count = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(decoder.step, fullgraph=True, backend=compile_count)
    with torch.set_grad_enabled(grad):
        eager_lp, eager_attn = roll(decoder.step, decoder, feats, tokens)
        compiled_lp, compiled_attn = roll(compiled, decoder, feats, tokens)
    graphs = 2 if grad and kind == "transformer" else 1
    assert compile_count.frame_count == graphs, f"{STEPS} steps compiled {compile_count.frame_count} graphs"
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch.testing.assert_close(compiled_lp, eager_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(compiled_attn, eager_attn, atol=1e-5, rtol=1e-5)
    if grad:
        params = [p for p in decoder.parameters() if p.requires_grad]
        picked = tokens.roll(-1, dims=1)[..., None]  # (B, T, 1): the next word at each step
        eager_grads = torch.autograd.grad(eager_lp.gather(2, picked).sum(), params, allow_unused=True)
        compiled_grads = torch.autograd.grad(compiled_lp.gather(2, picked).sum(), params, allow_unused=True)
        for p, e, c in zip(params, eager_grads, compiled_grads):
            assert (e is None) == (c is None)
            if e is not None:
                torch.testing.assert_close(c, e, atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_lstm_beam_step_compiles_one_graph_for_every_batch(monkeypatch) -> None:
    """Beam search's LSTM step (K rows per image over one copy of each grid) compiles to one
    graph whatever the number of images, as CUDA graphs of a GPU's beam search need. Its CPU
    blocks (here one image each) are a loop that a graph would unroll into one kernel per image,
    recompiled for every batch, and the longer the more images (docs/compile_step.md)."""
    from captioner.models import attention as attention_module

    monkeypatch.setattr(attention_module, "BLOCK_BYTES", 1)  # on the CPU's eager path: one image per block
    decoder, K = make_decoder("lstm"), 3
    compile_count = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(decoder.step, fullgraph=True, backend=compile_count)
    for images in (2, 4, 8, 16):
        feats = torch.randn(images, N, D)  # (B, N, D)
        memory = decoder.expand_memory(decoder.prepare(feats), K)  # the LSTM's: not copied per beam
        rows = torch.arange(images).repeat_interleave(K)  # (B*K,)
        state = {k: v.index_select(0, rows) for k, v in decoder.init_state(memory).items()}  # (B*K, H) each
        prev = torch.randint(3, V, (images * K,))  # (B*K,)
        for got, expected in zip(compiled(memory, prev, state)[:2], decoder.step(memory, prev, state)[:2]):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # static, then dynamic
    assert compile_count.frame_count <= 2, f"4 batch sizes compiled {compile_count.frame_count} graphs"


@pytest.mark.parametrize("prepared_in_autocast", [True, False], ids=["bf16_memory", "float32_memory"])
@torch.no_grad()
def test_transformer_state_keeps_its_shapes_and_dtype_under_autocast(prepared_in_autocast: bool) -> None:
    """The cache is allocated once in the memory's dtype and every step under bf16 autocast writes
    its (bf16) keys into it in that dtype: the state's shapes and dtypes never change, so the
    compiled step is never re-specialised. (An index_copy_ of bf16 keys into a float32 cache, as
    CUDA runs it, would raise here.) The logprobs stay close to the float32 ones."""
    decoder = make_decoder("transformer")
    feats, tokens = inputs()
    reference, _ = roll(decoder.step, decoder, feats, tokens[:, :4])  # (B, 4, V) in float32
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=prepared_in_autocast):
        memory = decoder.prepare(feats)
    state = decoder.init_state(memory, capacity=8)
    cache_dtype = torch.bfloat16 if prepared_in_autocast else torch.float32
    assert state["k_0"].dtype == cache_dtype and state["k_0"].shape == (B, 4, 8, 4)  # (B, nh, C, hs)
    shapes = {key: (value.shape, value.dtype) for key, value in state.items()}
    for t in range(4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logprobs, _, state = decoder.step(memory, tokens[:, t], state)
        assert {key: (value.shape, value.dtype) for key, value in state.items()} == shapes
        torch.testing.assert_close(logprobs.float(), reference[:, t], atol=0.1, rtol=0)
    assert state["pos"].tolist() == [4] * B


@torch.no_grad()
def test_transformer_step_past_its_capacity_fails_and_decoding_passes_its_length() -> None:
    decoder, feats, tokens, memory, state = transformer_after(steps=2, capacity=2)
    with pytest.raises(RuntimeError, match="capacity"):
        decoder.step(memory, tokens[:, 2], state)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        decoder.init_state(memory, capacity=0)
    assert decoder.init_state(memory)["k_0"].shape[2] == decoder.default_capacity
    decoder.default_capacity = 2  # the decoding functions must size the cache from max_length
    special = SpecialTokens(BOS, EOS)
    assert len(greedy_decode(decoder, feats, special, DecodeOptions(max_length=STEPS))) == B
    assert len(beam_search(decoder, feats, special, DecodeOptions(beam_size=2, max_length=STEPS))) == B


@torch.no_grad()
def test_transformer_step_leaves_the_given_state_intact() -> None:
    """Beam search, benchmarks and autograd may hold an earlier state: a step returns a new one."""
    decoder, _, tokens, memory, state = transformer_after(steps=1, capacity=4)
    before = {key: value.clone() for key, value in state.items()}
    first, _, _ = decoder.step(memory, tokens[:, 1], state)
    again, _, _ = decoder.step(memory, tokens[:, 1], state)
    for key, value in state.items():
        assert torch.equal(value, before[key]), key
    torch.testing.assert_close(again, first, atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_teacher_forcing_compiles_when_its_host_indices_go_to_another_device(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`train.compile` compiles the teacher-forced forward with dynamic shapes. Its host index
    tensors (the real positions) are pinned and copied to the device outside the graph: dynamo
    cannot trace pin_memory ("NYI: aten._pin_memory"), which would stop a compiled transformer
    step on a GPU. The meta device stands in for the GPU, and pinning is a no-op
    that counts its calls, since a CPU-only machine cannot pin."""
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *args, **kwargs: pinned.append(self.shape) or self)
    decoder = make_decoder(kind).train().to("meta")
    feats, tokens = (tensor.to("meta") for tensor in inputs())  # (B, N, D), (B, T)
    lengths = torch.tensor([STEPS, 4, 3])  # on the host, as the collate function leaves them
    with torch.no_grad():  # the LSTM's deferred weight gradient asks autocast about the device, which meta has not
        eager = decoder(feats, tokens, lengths, packed=True).logits  # (M, V)
        calls = len(pinned)
        reset_dynamo()
        # (M, V)
        compiled = torch.compile(decoder, backend="eager", dynamic=True)(feats, tokens, lengths, packed=True).logits
    assert compiled.shape == eager.shape == (STEPS + 4 + 3, V)
    assert calls >= 1 and len(pinned) == 2 * calls  # the compiled forward pinned the same indices, outside its graph
