"""Encoder + decoder + vocabulary + preprocessing: the one object every caller captions with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from captioner.config import Config
from captioner.data.images import ImageTransform, load_image
from captioner.decoding import Hypothesis, beam_search, greedy_decode
from captioner.errors import ImageLoadError
from captioner.models.decoder import Decoder, DecoderOutput
from captioner.models.encoder import Encoder
from captioner.vocab import Vocabulary


@dataclass
class Caption:
    text: str
    words: list[str]
    tokens: list[int]
    score: float  # length-normalised log-probability that ranked it
    logprob: float
    attn: torch.Tensor  # (T, L, H, h, w): every word's attention, per decoder layer and head
    finished: bool  # False when the maximum length cut it short

    def heatmaps(self, layer: int = -1, head: int | None = None) -> torch.Tensor:
        """(T, h, w) maps for display: one layer, one head or the mean over heads (the default)."""
        maps = self.attn[:, layer]  # (T, H, h, w)
        return maps.mean(dim=1) if head is None else maps[:, head]  # (T, h, w)

    def to_json(self) -> dict:
        return {"caption": self.text, "score": round(self.score, 4), "logprob": round(self.logprob, 4), "finished": self.finished}


class Captioner(nn.Module):
    """An image captioner with spatial attention; carries its config, vocabulary and transform."""

    def __init__(self, encoder: Encoder, decoder: Decoder, vocab: Vocabulary, config: Config) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.vocab = vocab
        self.config = config
        self.transform = ImageTransform(config.data.image_size)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.decoder.parameters()).dtype

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, 3, H, W) -> feats (B, N, D), grid (h, w)."""
        feats, grid = self.encoder(images)
        if self.config.model.blind:
            feats = torch.zeros_like(feats)  # the language-model baseline: no image information
        return feats, grid

    def forward(
        self,
        images: torch.Tensor,
        tokens: torch.Tensor,
        image_rows: torch.Tensor | None = None,
        encoded: bool = False,
        lengths: torch.Tensor | None = None,
    ) -> DecoderOutput:
        """Teacher forcing on images (B, 3, H, W), or on stored feats (B, N, D) when `encoded`.

        tokens (C, T) are C captions; caption c describes image `image_rows[c]` (default: c), so
        an image with five captions is encoded once and decoded five times. `lengths` (C,), sorted
        longest first, lets the decoder skip padding.
        """
        if encoded:  # stored features come as fp16; the cast runs on the device, after the copy
            feats = images.to(self.dtype)
            feats = torch.zeros_like(feats) if self.config.model.blind else feats
        else:
            feats, _ = self.encode(images)  # (B, N, D)
        if image_rows is not None:
            feats = feats.index_select(0, image_rows)  # (C, N, D)
        return self.decoder(feats, tokens, lengths)

    @torch.no_grad()
    def decode(
        self,
        feats: torch.Tensor,
        grid: tuple[int, int],
        beam_size: int | None = None,
        max_length: int | None = None,
        length_penalty: float | None = None,
    ) -> list[Caption]:
        """feats (B, N, D) -> one Caption per image; beam_size 1 is greedy decoding."""
        settings = self.config.decode
        beam_size = settings.beam_size if beam_size is None else beam_size
        max_length = settings.max_length if max_length is None else max_length
        alpha = settings.length_penalty if length_penalty is None else length_penalty
        bos, eos = self.vocab.bos_id, self.vocab.eos_id
        banned = (self.vocab.pad_id, bos, self.vocab.unk_id)  # not words: every word gets its own map
        if beam_size <= 1:
            hypotheses = greedy_decode(self.decoder, feats, bos, eos, max_length, banned=banned)
        else:
            hypotheses = beam_search(self.decoder, feats, bos, eos, beam_size, max_length, alpha, banned=banned)
        return [self._caption(h, grid) for h in hypotheses]

    def _caption(self, hyp: Hypothesis, grid: tuple[int, int]) -> Caption:
        words = self.vocab.decode_words(hyp.tokens)
        attn = hyp.attn.reshape(hyp.attn.shape[0], *hyp.attn.shape[1:3], *grid)  # (T, L, H, h, w)
        return Caption(" ".join(words), words, hyp.tokens, hyp.score, hyp.logprob, attn, hyp.finished)

    @torch.no_grad()
    def caption_images(self, images: torch.Tensor, **decode_options) -> list[Caption]:
        """Transformed images (B, 3, H, W) -> captions."""
        was_training = self.training
        self.eval()
        try:
            feats, grid = self.encode(images.to(self.device))
            return self.decode(feats, grid, **decode_options)
        finally:
            self.train(was_training)

    def caption(self, image: Image.Image | str | Path, **decode_options) -> Caption:
        """Caption one PIL image or image file."""
        if not isinstance(image, Image.Image):
            image = load_image(image)
        return self.caption_images(self.transform(image).unsqueeze(0), **decode_options)[0]

    def caption_files(
        self, paths: Sequence[str | Path], batch_size: int = 16, **decode_options
    ) -> list[Caption | ImageLoadError]:
        """Caption files in batches; a file that fails to load gives its error, the rest go on."""
        results: list[Caption | ImageLoadError] = []
        for start in range(0, len(paths), batch_size):
            chunk = paths[start : start + batch_size]
            loaded: list[torch.Tensor | ImageLoadError] = []
            for path in chunk:
                try:
                    loaded.append(self.transform(load_image(path)))
                except ImageLoadError as e:
                    loaded.append(e)
            good = [x for x in loaded if isinstance(x, torch.Tensor)]
            captions = iter(self.caption_images(torch.stack(good), **decode_options) if good else [])
            results += [x if isinstance(x, ImageLoadError) else next(captions) for x in loaded]
        return results
