"""Ensembles: several captioners with one vocabulary decode as one, behind the decoder interface: each
step's log-probability is the log of the members' mean probability, or with combine="logprob" their
renormalised mean log-probability; features travel packed, (B, sum of N_i * D_i)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from captioner.core.errors import CheckpointError, ConfigError
from captioner.data.image_transform import ImageTransform
from captioner.models.captioner import Captioner
from captioner.models.decoder import Decoder, DecoderOutput, Memory, State
from captioner.models.model_origin import ModelOrigin

COMBINES = ("prob", "logprob")  # the mean of probabilities; the renormalised mean of log-probabilities


def prefixed(parts: Iterable[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The members' memories or states, in order, as one dict: member i's under keys "<i>/<key>"."""
    return {f"{member}/{key}": value for member, part in enumerate(parts) for key, value in part.items()}


def member_part(tensors: dict[str, torch.Tensor], member: int) -> dict[str, torch.Tensor]:
    """The member's own entries of a `prefixed` dict, under their own keys."""
    prefix = f"{member}/"
    return {key[len(prefix) :]: value for key, value in tensors.items() if key.startswith(prefix)}


class EnsembleDecoder(Decoder):
    """M decoders over one vocabulary as one, over packed feats. A step's map (B, 1, 1, N) is the
    members' mean map with `mean_attention` (alike grids), else the first member's."""

    has_self_attention = False  # the members' self-attention weights are not combined

    def __init__(
        self, decoders: Sequence[Decoder], shapes: Sequence[tuple[int, int]], combine: str = "prob",
        mean_attention: bool | None = None,
    ) -> None:
        super().__init__()
        if combine not in COMBINES:
            raise ConfigError(f"ensemble: combine must be one of {', '.join(COMBINES)}; got {combine!r}")
        if not decoders or len(decoders) != len(shapes):
            raise ValueError(f"ensemble: {len(decoders)} decoders and {len(shapes)} feature shapes")
        sizes = sorted({decoder.vocab_size for decoder in decoders})
        if len(sizes) > 1:
            raise ConfigError(
                f"ensemble: the decoders' vocabularies differ in size ({', '.join(map(str, sizes))} words)"
            )
        self.members = nn.ModuleList(decoders)
        self.shapes = [(int(n), int(d)) for n, d in shapes]
        self.combine = combine
        self.vocab_size = sizes[0]
        self.mean_attention = len({n for n, _ in self.shapes}) == 1 if mean_attention is None else mean_attention

    def split(self, feats: torch.Tensor) -> list[torch.Tensor]:
        """Packed feats (B, sum N_i*D_i) -> each member's (B, N_i, D_i), in its decoder's dtype."""
        parts = feats.split([n * d for n, d in self.shapes], dim=1)  # (B, N_i*D_i) each
        return [
            part.reshape(part.shape[0], n, d).to(next(decoder.parameters()).dtype)  # (B, N_i, D_i)
            for part, (n, d), decoder in zip(parts, self.shapes, self.members)
        ]

    def prepare(self, feats: torch.Tensor) -> Memory:
        return prefixed(decoder.prepare(part) for decoder, part in zip(self.members, self.split(feats)))

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        return prefixed(decoder.init_state(member_part(memory, i), capacity) for i, decoder in enumerate(self.members))

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        logprobs, maps, states = [], [], []
        for i, decoder in enumerate(self.members):
            member_logprobs, attn, own_state = decoder.step(member_part(memory, i), prev_tokens, member_part(state, i))
            logprobs.append(member_logprobs.float())  # (R, V)
            maps.append(attn.float().mean(dim=(1, 2)))  # (R, N_i): the mean over layers and heads
            states.append(own_state)
        combined = self.combined(torch.stack(logprobs))  # (R, V)
        return combined, self.combined_map(maps)[:, None, None], prefixed(states)  # (R, V), (R, 1, 1, N)

    def forward(
        self, feats: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor | None = None,
        image_rows: torch.Tensor | None = None, packed: bool = False,
    ) -> DecoderOutput:
        """Combined log-probabilities (C, T, V), attn (C, T, 1, 1, N); never packed (members' orders differ)."""
        logprobs, maps = [], []
        for decoder, part in zip(self.members, self.split(feats)):
            out = decoder(part, tokens, lengths, image_rows=image_rows)
            logprobs.append(out.logits.float().log_softmax(dim=-1))  # (B, T, V)
            maps.append(out.attn.float().mean(dim=(2, 3)))  # (B, T, N_i)
        return DecoderOutput(self.combined(torch.stack(logprobs)), self.combined_map(maps)[:, :, None, None])

    def combined(self, logprobs: torch.Tensor) -> torch.Tensor:
        """The members' log-probabilities (M, ..., V) -> the ensemble's (..., V)."""
        if self.combine == "prob":  # log of the mean probability, without leaving log space
            return torch.logsumexp(logprobs, dim=0) - math.log(logprobs.shape[0])  # (..., V)
        return logprobs.mean(dim=0).log_softmax(dim=-1)  # (..., V)

    def combined_map(self, maps: list[torch.Tensor]) -> torch.Tensor:
        """The members' maps (..., N_i) -> their mean, or the first member's (..., N_0)."""
        return torch.stack(maps).mean(dim=0) if self.mean_attention else maps[0]


class EnsembleTransform:
    """Every member's transform of one picture, flattened and concatenated: uint8 (P = sum 3 S_i^2,)."""

    def __init__(self, transforms: Sequence[ImageTransform]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: Image.Image | torch.Tensor, seed: int | None = None) -> torch.Tensor:
        return torch.cat([transform(image, seed).flatten() for transform in self.transforms])  # (P,)

    def split(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Packed images (B, P) -> each member's (B, 3, S_i, S_i)."""
        sides = [transform.image_size for transform in self.transforms]
        parts = images.split([3 * side * side for side in sides], dim=1)  # (B, 3*S_i*S_i) each
        return [part.reshape(part.shape[0], 3, side, side) for part, side in zip(parts, sides)]  # (B, 3, S_i, S_i)


class Ensemble(nn.Module):
    """Captioners with one vocabulary that caption as one model, `caption` and `decode` as
    `Captioner`'s; decoding defaults and the maps' grid are the first member's."""

    # Captioner's own code: it reads only what an ensemble has too.
    special_tokens = Captioner.special_tokens
    device = Captioner.device
    decode_options = Captioner.decode_options
    decode = Captioner.decode
    _caption_batch = Captioner._caption_batch
    caption = Captioner.caption
    attention_shape = Captioner.attention_shape  # the decoder's (1, 1): one map a word

    def __init__(self, members: Sequence[Captioner], combine: str = "prob", names: Sequence[str] | None = None) -> None:
        super().__init__()
        if not members:
            raise ConfigError("ensemble: no members")
        self.names = list(names) if names is not None else [f"member {i + 1}" for i in range(len(members))]
        check_same_vocabulary(members, self.names)
        self.members = nn.ModuleList(members)
        self.vocab = members[0].vocab
        self.decode_config = members[0].decode_config
        self.transform = EnsembleTransform([member.transform for member in members])
        grids = [member.grid_size() for member in members]
        shapes = [(h * w, member.encoder.out_dim) for (h, w), member in zip(grids, members)]  # (N_i, D_i)
        self.grid: tuple[int, int] = grids[0]
        self.decoder = EnsembleDecoder(
            [member.decoder for member in members], shapes, combine, mean_attention=len(set(grids)) == 1
        )

    @classmethod
    def from_pretrained(
        cls, paths: Sequence[str | Path], device: str | torch.device = "auto", combine: str = "prob"
    ) -> Ensemble:
        """The models at `paths` (as `Captioner.from_pretrained`) as one ensemble in eval mode on `device`."""
        if combine not in COMBINES:  # before loading anything
            raise ConfigError(f"ensemble: combine must be one of {', '.join(COMBINES)}; got {combine!r}")
        members = [Captioner.from_pretrained(path, device) for path in paths]
        return cls(members, combine, names=[str(path) for path in paths]).eval()

    @property
    def origins(self) -> list[ModelOrigin | None]:
        """Where each member came from: the caption paths log every member that answers."""
        return [member.origin for member in self.members]

    @property
    def packed_width(self) -> int:
        """Width of the packed feats `encode` makes: sum over members of N_i * D_i."""
        return sum(n * d for n, d in self.decoder.shapes)

    def stored_features(self, feats: torch.Tensor) -> torch.Tensor:
        """Packed feats that `encode` made -> the decoder's input, unchanged (`EnsembleDecoder.split` casts)."""
        return feats

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Packed images (B, P), uint8 -> packed feats (B, sum N_i*D_i), float32, and the first grid (h, w)."""
        feats = [
            member.encode(part.to(member.device))[0].flatten(1).float()  # (B, N_i*D_i)
            for member, part in zip(self.members, self.transform.split(images))
        ]
        return torch.cat(feats, dim=1), self.grid  # (B, sum N_i*D_i)


def check_same_vocabulary(members: Sequence[Captioner], names: Sequence[str]) -> None:
    """A one-line CheckpointError naming the first member whose vocabulary differs, and how."""
    first = members[0].vocab.to_list()
    for name, member in zip(names[1:], members[1:]):
        words = member.vocab.to_list()
        if words == first:
            continue
        at = next((i for i, (a, b) in enumerate(zip(first, words)) if a != b), None)
        how = (
            f"word {at} is {first[at]!r} in one, {words[at]!r} in the other"
            if at is not None else f"{len(first)} vs {len(words)} words"
        )
        raise CheckpointError(
            f"ensemble: {names[0]} and {name} have different vocabularies ({how}); members must share one"
        )
