"""Encoder + decoder + vocabulary + preprocessing: the one object every caller captions with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from captioner.core.config import DecodeConfig, ModelConfig
from captioner.core.errors import ConfigError, ImageLoadError
from captioner.data.images import ImageTransform, load_image
from captioner.models.caption import Caption
from captioner.models.decoder import Decoder, DecoderOutput
from captioner.models.decoding import (
    Hypothesis,
    beam_search_n_best,
    check_sampling,
    greedy_decode,
)
from captioner.models.encoders import Encoder
from captioner.text.vocab import Vocabulary


class Captioner(nn.Module):
    """An image captioner with spatial attention; carries its model configuration, vocabulary,
    transform and decoding defaults, and nothing about how it was trained."""

    def __init__(
        self, encoder: Encoder, decoder: Decoder, vocab: Vocabulary, config: ModelConfig, image_size: int,
        decode_config: DecodeConfig | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.vocab = vocab
        self.config = config
        self.image_size = image_size
        self.decode_config = decode_config or DecodeConfig()
        self.transform = ImageTransform(image_size)

    def settings(self) -> dict:
        """The config sections that rebuild this model (a checkpoint without a training config
        carries these): the model, the input size and the decoding defaults."""
        return {"model": asdict(self.config), "data": {"image_size": self.image_size}, "decode": asdict(self.decode_config)}

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.decoder.parameters()).dtype

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, 3, H, W), uint8 from `self.transform` (normalised on their device by the
        encoder) or already-normalised floats -> feats (B, N, D), grid (h, w)."""
        feats, grid = self.encoder(images)  # (B, N, D)
        return self.withhold_if_blind(feats), grid

    def stored_features(self, feats: torch.Tensor) -> torch.Tensor:
        """Features from the store, (B, N, D) fp16 -> the decoder's input, as `encode` would have
        made them: cast to the model's dtype on their device (after the copy), and zeroed for
        a blind model. Every path that decodes stored features goes through here."""
        return self.withhold_if_blind(feats.to(self.dtype))

    def withhold_if_blind(self, feats: torch.Tensor) -> torch.Tensor:
        """A blind model (model.blind, the language-model baseline) sees zeros, not the image."""
        return torch.zeros_like(feats) if self.config.blind else feats

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
        if encoded:
            feats = self.stored_features(images)  # (B, N, D)
        else:
            feats, _ = self.encode(images)  # (B, N, D)
        if image_rows is not None:
            feats = feats.index_select(0, image_rows)  # (C, N, D)
        return self.decoder(feats, tokens, lengths)

    @torch.no_grad()
    def decode(self, feats: torch.Tensor, grid: tuple[int, int], **options) -> list[Caption]:
        """feats (B, N, D) -> one Caption per image, the best one; options as `decode_n_best`."""
        return [captions[0] for captions in self.decode_n_best(feats, grid, n_best=1, **options)]

    @torch.no_grad()
    def decode_n_best(
        self,
        feats: torch.Tensor,
        grid: tuple[int, int],
        n_best: int = 1,
        beam_size: int | None = None,
        max_length: int | None = None,
        length_penalty: float | None = None,
        block_trigrams: bool | None = None,
        diverse_groups: int | None = None,
        diversity_strength: float | None = None,
        sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        self_attention: bool = False,
    ) -> list[list[Caption]]:
        """feats (B, N, D) -> per image the `n_best` best distinct captions, best first.

        Options left at None come from the config's `decode` section. Beam search (beam_size > 1,
        optionally diverse with `diverse_groups` groups) gives up to beam_size hypotheses; greedy
        decoding (beam_size 1) gives one. With `sample`, each of the n_best captions is drawn
        from softmax(logprobs / temperature), restricted to the `top_k` words and the `top_p`
        nucleus, seeded by `seed`, and they are sorted by log-probability. With `self_attention`
        (decoders that have one) each caption carries its self-attention weights from the same pass.
        """
        settings = self.decode_config
        beam_size = settings.beam_size if beam_size is None else beam_size
        max_length = settings.max_length if max_length is None else max_length
        alpha = settings.length_penalty if length_penalty is None else length_penalty
        block = settings.block_trigrams if block_trigrams is None else block_trigrams
        groups = settings.diverse_groups if diverse_groups is None else diverse_groups
        strength = settings.diversity_strength if diversity_strength is None else diversity_strength
        self._check_decode_options(n_best, beam_size, max_length, groups, strength, sample, temperature, top_k, top_p)
        bos, eos = self.vocab.bos_id, self.vocab.eos_id
        banned = (self.vocab.pad_id, bos, self.vocab.unk_id)  # not words: every word gets its own map
        B = feats.shape[0]
        if sample:
            generator = None if seed is None else torch.Generator(feats.device).manual_seed(seed)
            rows = feats.repeat_interleave(n_best, dim=0)  # (B*n_best, N, D): n_best draws per image
            drawn = greedy_decode(
                self.decoder, rows, bos, eos, max_length, temperature, generator, banned, top_k, top_p, block, self_attention
            )
            ranked = [sorted(drawn[b * n_best : (b + 1) * n_best], key=lambda h: -h.score) for b in range(B)]
        elif beam_size <= 1:
            ranked = [
                [h]
                for h in greedy_decode(
                    self.decoder, feats, bos, eos, max_length, banned=banned, block_trigrams=block, self_attention=self_attention
                )
            ]
        else:
            ranked = beam_search_n_best(
                self.decoder, feats, bos, eos, beam_size, max_length, alpha, banned, block, groups, strength, n_best,
                self_attention,
            )
        return [[self._caption(h, grid) for h in hyps] for hyps in ranked]

    @staticmethod
    def _check_decode_options(
        n_best: int, beam_size: int, max_length: int, groups: int, strength: float,
        sample: bool, temperature: float, top_k: int, top_p: float,
    ) -> None:
        """Decoding options from a caller or the CLI: a one-line error naming the bad one."""
        if n_best < 1:
            raise ConfigError(f"decode: n_best must be >= 1, got {n_best}")
        if beam_size < 1 or max_length < 1:
            raise ConfigError(f"decode: beam size and max length must be >= 1, got {beam_size} and {max_length}")
        if sample:
            try:
                check_sampling(temperature, top_k, top_p)
            except ValueError as e:
                raise ConfigError(f"decode: {e}") from None
            return
        if groups < 1 or beam_size % groups:
            raise ConfigError(f"decode: beam size {beam_size} must be a multiple of diverse_groups {groups}")
        if strength < 0:
            raise ConfigError(f"decode: diversity_strength must be >= 0, got {strength}")
        if n_best > beam_size:
            raise ConfigError(f"decode: n_best ({n_best}) cannot exceed the beam size ({beam_size}); raise the beam or sample")

    def _caption(self, hyp: Hypothesis, grid: tuple[int, int]) -> Caption:
        words = self.vocab.decode_words(hyp.tokens)
        attn = hyp.attn.reshape(hyp.attn.shape[0], *hyp.attn.shape[1:3], *grid)  # (T, L, H, h, w)
        return Caption(" ".join(words), words, hyp.tokens, hyp.score, hyp.logprob, attn, hyp.finished, hyp.self_attn)

    @torch.no_grad()
    def caption_images(
        self, images: torch.Tensor, n_best: int | None = None, **decode_options
    ) -> list[Caption] | list[list[Caption]]:
        """Transformed images (B, 3, H, W), uint8 as `self.transform` makes them -> a caption per
        image, or with `n_best` a list of the n best per image."""
        was_training = self.training
        self.eval()
        try:
            feats, grid = self.encode(images.to(self.device))
            if n_best is not None:
                return self.decode_n_best(feats, grid, n_best, **decode_options)
            return self.decode(feats, grid, **decode_options)
        finally:
            self.train(was_training)

    def caption(self, image: Image.Image | str | Path, **decode_options) -> Caption:
        """Caption one PIL image or image file."""
        if not isinstance(image, Image.Image):
            image = load_image(image)
        return self.caption_images(self.transform(image).unsqueeze(0), **decode_options)[0]

    def caption_files(
        self, paths: Sequence[str | Path], batch_size: int | None = None, **decode_options
    ) -> list[Caption | ImageLoadError] | list[list[Caption] | ImageLoadError]:
        """Caption files in batches (of the config's decode.batch_size unless given); a file that
        fails to load gives its error, the rest go on.

        With `n_best=N` among the options, each good file gives its list of N captions."""
        batch_size = batch_size or self.decode_config.batch_size
        results: list = []
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
