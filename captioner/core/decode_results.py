"""What decoding returns, in the torch model and in the torch-free ONNX runtime alike: a loop's
`Hypothesis`, ranked by GNMT's `length_penalty`, and the `Caption` a caller reads. Their maps are
torch tensors from `captioner.models`, numpy arrays from `captioner.deploy`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ((5 + length) / 6) ** alpha; alpha = 0 ranks by total log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


@dataclass
class Hypothesis:
    tokens: list[int]  # word ids, without <bos> and <eos>
    score: float  # total log-probability, divided by the length penalty
    logprob: float  # total log-probability, <eos> included when the caption ended
    attn: Any  # (T, L, H, N): the attention at each word
    finished: bool  # False when max_length was reached before <eos>
    self_attn: Any = None  # (T, L, H, T) when asked for (torch's transformers): as Caption.self_attn

    def caption(self, words: list[str], grid: tuple[int, int]) -> Caption:
        """This hypothesis as a Caption of its `words`, its maps on the encoder's grid (h, w)."""
        attn = self.attn.reshape(self.attn.shape[0], *self.attn.shape[1:3], *grid)  # (T, L, H, h, w)
        return Caption(" ".join(words), words, self.tokens, self.score, self.logprob, attn, self.finished,
                       self.self_attn)


@dataclass
class Caption:
    """One caption of one image: its words, how decoding scored it, and where it looked."""

    text: str
    words: list[str]
    tokens: list[int]
    score: float  # length-normalised log-probability that ranked it
    logprob: float
    attn: Any  # (T, L, H, h, w) float32: every word's attention, per decoder layer and head
    finished: bool  # False when the maximum length cut it short
    # (T, L, H, T) with self_attention=True (transformers): at word t, the self-attention's weights
    # over the input positions 0..t (<bos>, then the words before t); zero on later positions.
    self_attn: Any = None

    def heatmaps(self, layer: int = -1, head: int | None = None) -> Any:
        """(T, h, w) maps for display: one layer, one head or the mean over heads (the default)."""
        maps = self.attn[:, layer]  # (T, H, h, w)
        return maps.mean(axis=1) if head is None else maps[:, head]  # (T, h, w)

    def to_json(self) -> dict:
        return {"caption": self.text, "score": round(self.score, 4), "logprob": round(self.logprob, 4),
                "finished": self.finished}
