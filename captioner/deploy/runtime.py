"""`OnnxCaptioner`: caption images from an exported folder with onnxruntime, numpy and Pillow.

    from captioner.deploy import OnnxCaptioner
    model = OnnxCaptioner.from_folder("export/")          # the folder `captioner export --onnx` wrote
    caps = model.caption(["a.jpg", pil_image], beam_size=3)
    caps[0].text, caps[0].score, caps[0].heatmaps()      # (T, h, w) attention per word

Images become the same bytes as the PyTorch transform (`captioner.data.image_transform.ImageTransform`);
the search (`numpy_search.py`) calls the step graph once per word.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.decode_schema import check_capacity, check_names, check_options
from captioner.data.image_files import ImageInput, caption_in_batches
from captioner.deploy.bundle import Bundle, load_bundle
from captioner.deploy.numpy_search import Arrays, Hypothesis, SearchOptions, TokenRules, decode_hypotheses
from captioner.text.endings import bad_ending_ids


def image_array(picture: Image.Image, size: int) -> np.ndarray:
    """An RGB picture -> uint8 (3, size, size): Pillow's bilinear resize, channels first."""
    resized = np.asarray(picture.resize((size, size), Image.BILINEAR))  # (S, S, 3)
    return np.ascontiguousarray(resized.transpose(2, 0, 1))  # (3, S, S)


@dataclass
class OnnxCaption:
    """One image's caption, as `captioner.models.caption_result.Caption` holds it, in numpy."""

    text: str
    words: list[str]
    tokens: list[int]
    score: float  # length-normalised log-probability that ranked it
    logprob: float
    attn: np.ndarray  # (T, L, H, h, w) float32: every word's attention, per decoder layer and head
    finished: bool  # False when the maximum length cut it short

    def heatmaps(self, layer: int = -1, head: int | None = None) -> np.ndarray:
        """(T, h, w) maps for display: one layer, one head or the mean over heads (the default)."""
        maps = self.attn[:, layer]  # (T, H, h, w)
        return maps.mean(axis=1) if head is None else maps[:, head]  # (T, h, w)

    def to_json(self) -> dict:
        return {"caption": self.text, "score": round(self.score, 4), "logprob": round(self.logprob, 4),
                "finished": self.finished}


# The decoding options the exported search implements (core/decode_schema.py declares them all).
SEARCH_OPTIONS = ("beam_size", "max_length", "length_penalty", "block_trigrams", "min_length", "suppress_bad_endings")


class OnnxCaptioner:
    """An exported captioner: its onnxruntime sessions, vocabulary and decoding defaults."""

    def __init__(self, bundle: Bundle) -> None:
        manifest = bundle.manifest
        self.bundle = bundle
        self.vocab = bundle.vocab
        self.image_size: int = bundle.image_size
        self.grid: tuple[int, int] = bundle.grid
        self.capacity: int | None = manifest["capacity"]
        self.decode_defaults: dict[str, Any] = dict(bundle.decode)
        self.memory_names = [f"memory.{k}" for k in manifest["memory"]]
        self.state_names = [f"state.{k}" for k in manifest["state"]]
        special = bundle.special
        V = len(self.vocab)
        banned = np.zeros(V, dtype=bool)  # (V,)
        banned[list(special.banned)] = True
        bad_endings = np.zeros(V, dtype=bool)  # (V,)
        bad_endings[list(bad_ending_ids(self.vocab.index))] = True
        self.rules = TokenRules(special.bos, special.eos, banned, bad_endings)

    @classmethod
    def from_folder(cls, folder: str | Path, threads: int | None = None) -> OnnxCaptioner:
        """The export in `folder` (holding onnx.json, or its parent), checked (`bundle.load_bundle`);
        `threads`: onnxruntime's threads per operator (default: the cores available)."""
        return cls(load_bundle(folder, threads))

    def options(self, **overrides: Any) -> SearchOptions:
        """The decoding defaults with `overrides` (None keeps a default), checked in one ConfigError line."""
        check_names(overrides, SEARCH_OPTIONS, " for the ONNX runtime")
        values = {name: self.decode_defaults.get(name, DECODE_OPTIONS[name].default) for name in SEARCH_OPTIONS}
        values.update({name: value for name, value in overrides.items() if value is not None})
        values = check_options(values)
        check_capacity(values["max_length"], self.capacity, str(self.bundle.path("decoder_step")))
        return SearchOptions(**values)

    def caption(
        self, images: ImageInput | Sequence[ImageInput], *, n_best: int | None = None, batch_size: int | None = None,
        errors: str = "raise", **options: Any,
    ) -> OnnxCaption | list[Any]:
        """As `Captioner.caption`: an image (path, bytes or PIL image) gives its caption, a list a list
        (with `n_best`, each image's n best); `options`: the `SEARCH_OPTIONS` (None: the export's).
        `errors="return"` puts an unreadable image's error in its place."""
        search = self.options(**options)
        if n_best is not None:
            check_options({"n_best": n_best, "beam_size": search.beam_size})
        return caption_in_batches(
            images, batch_size or int(self.decode_defaults.get("batch_size", 32)),
            lambda pictures: self.caption_arrays(np.stack([image_array(p, self.image_size) for p in pictures]),
                                                 search, n_best),  # (B, 3, S, S)
            n_best=n_best, errors=errors,
        )

    def caption_arrays(self, images: np.ndarray, search: SearchOptions | None = None,
                       n_best: int | None = None) -> list:
        """uint8 images (B, 3, S, S) -> a caption each, or with `n_best` each image's n best, best first."""
        feats = self.encode(images)  # (B, N, D)
        memory, state = self.start(feats)
        ranked = decode_hypotheses(self.step, memory, state, self.rules, search or self.options(), n_best or 1)
        captions = [[self._caption(h) for h in hyps] for hyps in ranked]
        return captions if n_best is not None else [best[0] for best in captions]

    def encode(self, images: np.ndarray) -> np.ndarray:
        """uint8 images (B, 3, S, S) -> feats (B, N, D)."""
        return self.bundle.sessions["encoder"].run(["feats"], {"images": images})[0]  # (B, N, D)

    def start(self, feats: np.ndarray) -> tuple[Arrays, Arrays]:
        """feats (B, N, D) -> the decoder's memory and first state, by name."""
        outputs = self.bundle.sessions["decoder_init"].run(None, {"feats": feats})
        n = len(self.memory_names)
        return dict(zip(self.memory_names, outputs[:n])), dict(zip(self.state_names, outputs[n:]))

    def step(self, memory: Arrays, prev: np.ndarray, state: Arrays) -> tuple[np.ndarray, np.ndarray, Arrays]:
        """One decoder step: prev (R,) -> logprobs (R, V), attn (R, L, H, N), the next state."""
        outputs = self.bundle.sessions["decoder_step"].run(None, {**memory, "prev_tokens": prev, **state})
        return outputs[0], outputs[1], dict(zip(self.state_names, outputs[2:]))

    def _caption(self, hyp: Hypothesis) -> OnnxCaption:
        words = self.vocab.decode_words(hyp.tokens)
        attn = hyp.attn.reshape(hyp.attn.shape[0], *hyp.attn.shape[1:3], *self.grid)  # (T, L, H, h, w)
        return OnnxCaption(" ".join(words), words, hyp.tokens, hyp.score, hyp.logprob, attn, hyp.finished)
