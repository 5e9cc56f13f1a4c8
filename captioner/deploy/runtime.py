"""`OnnxCaptioner`: caption images from an exported folder with onnxruntime, numpy and Pillow.

    from captioner.deploy import OnnxCaptioner
    model = OnnxCaptioner.from_folder("export/")          # the folder `captioner export --onnx` wrote
    caps = model.caption(["a.jpg", pil_image], beam_size=3)
    caps[0].text, caps[0].score, caps[0].heatmaps()      # (T, h, w) attention per word

The encoder graph turns a batch into feats, the init graph makes the decoder's memory and first
state, and the search (`numpy_search.py`) calls the step graph once per word over every image's beams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.decode_schema import check_capacity, check_names, check_options
from captioner.core.errors import ImageLoadError
from captioner.data.image_files import ImageInput, load_image, picture_batches
from captioner.deploy.bundle import Bundle, load_bundle
from captioner.deploy.preprocess import image_array, image_batch
from captioner.deploy.numpy_search import Arrays, Hypothesis, SearchOptions, TokenRules, decode_hypotheses
from captioner.text.endings import bad_ending_ids


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
        return {"caption": self.text, "score": round(self.score, 4), "logprob": round(self.logprob, 4), "finished": self.finished}


# The decoding options the exported search implements (core/decode_schema.py declares them all).
SEARCH_OPTIONS = ("beam_size", "max_length", "length_penalty", "block_trigrams", "min_length", "suppress_bad_endings")


class OnnxCaptioner:
    """An exported captioner: its three onnxruntime sessions, vocabulary, input size and
    decoding defaults (the model's `decode` section at export)."""

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
        """The export in `folder` (the one holding onnx.json, or its parent), checked: a missing
        or changed graph, or another format version, is a one-line ExportError naming the file.
        `threads`: onnxruntime's threads per operator (default: the cores available)."""
        return cls(load_bundle(folder, threads))

    def options(self, **overrides: Any) -> SearchOptions:
        """The decoding defaults with `overrides` (None keeps a default), checked: a bad value,
        or a max_length beyond the steps the graph was exported for, is a one-line ConfigError."""
        check_names(overrides, SEARCH_OPTIONS, " for the ONNX runtime")
        values = {name: self.decode_defaults.get(name, DECODE_OPTIONS[name].default) for name in SEARCH_OPTIONS}
        values.update({name: value for name, value in overrides.items() if value is not None})
        values = check_options(values)
        check_capacity(values["max_length"], self.capacity, str(self.bundle.path("decoder_step")))
        return SearchOptions(**values)

    @overload
    def caption(self, images: ImageInput, *, batch_size: int | None = None, **options: Any) -> OnnxCaption: ...

    @overload
    def caption(
        self, images: list[ImageInput] | tuple[ImageInput, ...], *, batch_size: int | None = None, **options: Any
    ) -> list[OnnxCaption]: ...

    def caption(
        self, images: ImageInput | list[ImageInput] | tuple[ImageInput, ...], *, batch_size: int | None = None, **options: Any
    ) -> OnnxCaption | list[OnnxCaption]:
        """Caption an image (a path, an encoded file's bytes or a PIL image) or a list of them,
        in batches of `batch_size` (default: the export's decode.batch_size). `options`:
        beam_size, max_length, length_penalty, block_trigrams, min_length, suppress_bad_endings
        (None: the export's defaults). A list stops at its first image that does not load, with
        that image's one-line ImageLoadError."""
        search = self.options(**options)
        single = not isinstance(images, (list, tuple))
        items: list[ImageInput] = [images] if single else list(images)  # type: ignore[list-item]
        batch_size = batch_size or int(self.decode_defaults.get("batch_size", 32))
        captions: list[OnnxCaption] = []
        for pictures in picture_batches(items, batch_size, positions=not single):
            captions += self.caption_arrays(image_batch(pictures, self.image_size), search)
        return captions[0] if single else captions

    def caption_files(
        self, paths: Sequence[str | Path], batch_size: int | None = None, n_best: int | None = None, **options: Any
    ) -> list[OnnxCaption | ImageLoadError] | list[list[OnnxCaption] | ImageLoadError]:
        """Caption files in batches (default: the export's decode.batch_size); a file that fails
        to load gives its one-line error in its place and the rest go on (as
        `Captioner.caption_files`, for the command line). With `n_best`, each good file gives
        its list of up to n_best distinct captions, best first (n_best <= beam_size)."""
        search = self.options(**options)
        self._check_n_best(n_best, search)
        batch_size = batch_size or int(self.decode_defaults.get("batch_size", 32))
        results: list[OnnxCaption | ImageLoadError] = []
        for start in range(0, len(paths), batch_size):
            loaded: list[np.ndarray | ImageLoadError] = []
            for path in paths[start : start + batch_size]:
                try:
                    loaded.append(image_array(load_image(path), self.image_size))  # (3, S, S)
                except ImageLoadError as e:
                    loaded.append(e)
            good = [x for x in loaded if isinstance(x, np.ndarray)]
            ranked = iter(self.caption_arrays_n_best(np.stack(good), search, n_best or 1) if good else [])  # (b, 3, S, S) in
            for x in loaded:
                if isinstance(x, ImageLoadError):
                    results.append(x)
                else:
                    captions = next(ranked)
                    results.append(captions if n_best is not None else captions[0])
        return results

    def caption_arrays(self, images: np.ndarray, search: SearchOptions | None = None) -> list[OnnxCaption]:
        """uint8 images (B, 3, S, S), as `preprocess.image_batch` makes them -> a caption each."""
        return [ranked[0] for ranked in self.caption_arrays_n_best(images, search or self.options(), 1)]

    def caption_arrays_n_best(self, images: np.ndarray, search: SearchOptions, n_best: int) -> list[list[OnnxCaption]]:
        """uint8 images (B, 3, S, S) -> per image its n_best distinct captions, best first
        (greedy decoding, beam_size 1, gives one)."""
        feats = self.encode(images)  # (B, N, D)
        memory, state = self.start(feats)
        ranked = decode_hypotheses(self.step, memory, state, self.rules, search, n_best)
        return [[self._caption(h) for h in hyps] for hyps in ranked]

    @staticmethod
    def _check_n_best(n_best: int | None, search: SearchOptions) -> None:
        if n_best is None:
            return
        check_options({"n_best": n_best, "beam_size": search.beam_size})

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
