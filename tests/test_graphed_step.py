"""`decode.cuda_graphs`: the decoder step replayed as a CUDA graph while decoding.

A CUDA graph writes every replay's outputs into the same memory. On the CPU a stand-in plays
that part (`Replay`: per number of rows, one set of output buffers, overwritten by each call),
so the wrapper's contract is tested here: beam search and greedy decoding through it give the
eager results exactly, gradients, keyword arguments and CPU tensors take the eager step, and
each replay starts a new step of the graph tree. On a GPU, `python -m benchmarks cuda_graphs`
compares the real graphs' captions with the eager step's (docs/gpu.md).
"""

from __future__ import annotations

import copy

import pytest
import torch

from captioner.core.config import load_config
from captioner.core.errors import ConfigError
from captioner.models.decoder import Decoder, GraphedStep, use_graphed_step
from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search_n_best, greedy_decode
from captioner.models.decoders.lstm import LSTMConfig, LSTMDecoder
from captioner.models.decoders.transformer import TransformerConfig, TransformerDecoder
from helpers import tiny_model

V, D, N, B = 13, 6, 9, 3
SPECIAL = SpecialTokens(1, 2)


def make_decoder(kind: str) -> Decoder:
    torch.manual_seed(0)
    if kind == "lstm":
        return LSTMDecoder(LSTMConfig(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.0), V, D).eval()
    return TransformerDecoder(TransformerConfig(d_model=16, num_layers=2, num_heads=4, ff_dim=32, dropout=0.0),
                              V, D).eval()


class Replay:
    """A CUDA graph's memory rule on the CPU: per number of rows one set of output buffers,
    which every call overwrites."""

    def __init__(self, eager) -> None:
        self.eager = eager
        self.buffers: dict[int, tuple] = {}
        self.calls = 0

    def __call__(self, memory, prev, state):
        self.calls += 1
        logprobs, attn, new_state = self.eager(memory, prev, state)
        rows = prev.shape[0]
        if rows not in self.buffers:
            self.buffers[rows] = (torch.empty_like(logprobs), torch.empty_like(attn),
                                  {k: torch.empty_like(v) for k, v in new_state.items()})
        out_logprobs, out_attn, out_state = self.buffers[rows]
        out_logprobs.copy_(logprobs)
        out_attn.copy_(attn)
        for key, value in new_state.items():
            out_state[key].copy_(value)
        return out_logprobs, out_attn, out_state


def replaying(decoder: Decoder) -> Replay:
    """The decoder's step becomes a GraphedStep whose graph is the CPU stand-in."""
    step = use_graphed_step(decoder)
    step.device_type = "cpu"
    step.graphed = Replay(step.eager)
    return step.graphed


def feats() -> torch.Tensor:
    return torch.randn(B, N, D, generator=torch.Generator().manual_seed(1))  # (B, N, D)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("beam", [1, 3])
def test_decoding_through_replays_gives_the_eager_captions_and_maps(kind: str, beam: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    options = DecodeOptions(beam_size=beam, max_length=7, n_best=beam)
    search = (lambda d, f: [[h] for h in greedy_decode(d, f, SPECIAL, options)]) if beam == 1 else (
        lambda d, f: beam_search_n_best(d, f, SPECIAL, options))
    decoder = make_decoder(kind)
    eager = search(decoder, feats())
    replay = replaying(decoder)
    replayed = search(decoder, feats())
    assert replay.calls > 1 and len(marks) == replay.calls  # every call went through the stand-in, each a new replay
    for hyps, hyps_replayed in zip(eager, replayed, strict=True):
        for h, r in zip(hyps, hyps_replayed, strict=True):
            assert r.tokens == h.tokens and r.score == h.score
            torch.testing.assert_close(r.attn, h.attn, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_gradients_keywords_and_other_devices_take_the_eager_step(kind: str) -> None:
    decoder = make_decoder(kind)
    replay = replaying(decoder)
    memory = decoder.prepare(feats())
    state = decoder.init_state(memory, capacity=4)
    prev = torch.full((B,), SPECIAL.bos)
    decoder.step(memory, prev, state)  # autograd on: SCST's sampling
    if decoder.has_self_attention:
        with torch.no_grad():
            _, _, inspected = decoder.step(memory, prev, state, self_attention=True)
        assert "self_attn" in inspected
    decoder.step.device_type = "cuda"  # the real setting: these tensors are on the CPU
    with torch.no_grad():
        decoder.step(memory, prev, state)
    assert replay.calls == 0


def test_the_wrapper_is_installed_once_and_copies_with_its_model() -> None:
    decoder = make_decoder("lstm")
    step = use_graphed_step(decoder)
    assert use_graphed_step(decoder) is step and decoder.step is step
    assert "step" not in decoder.state_dict() and not any("step" in name for name in decoder.state_dict())
    twin = copy.deepcopy(decoder)  # the ONNX export copies the model
    assert isinstance(twin.step, GraphedStep) and twin.step is not step
    assert twin.step.eager.__self__ is twin and twin.step.lock is not step.lock


def test_the_setting_is_ignored_on_the_cpu_and_checked_in_the_config() -> None:
    assert load_config(None, ["decode.cuda_graphs=true"]).decode.cuda_graphs is True
    with pytest.raises(ConfigError, match="decode.cuda_graphs"):
        load_config(None, ["decode.cuda_graphs=sometimes"])
    plain, graphed = tiny_model(), tiny_model("decode.cuda_graphs=true")
    image = torch.randint(0, 256, (2, 3, plain.image_size, plain.image_size), dtype=torch.uint8)
    assert [c.text for c in graphed.caption(image)] == [c.text for c in plain.caption(image)]
    assert "step" not in graphed.decoder.__dict__  # no graph on the CPU
