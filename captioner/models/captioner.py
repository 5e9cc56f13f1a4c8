"""Encoder + decoder + vocabulary + preprocessing: the one object every caller captions with
(`Captioner.from_pretrained(path)`, then `model.caption(images)`); its files record its spec."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from PIL.Image import Image
from torch import nn
from torch.overrides import TorchFunctionMode

from captioner.core.config_sections import Config, DecodeConfig, ModelConfig
from captioner.core.decoder_types import section
from captioner.core.errors import CheckpointError, ConfigError, ExportError
from captioner.core.model_spec import ModelSpec, Preprocessing
from captioner.core.process_settings import resolve_device
from captioner.data.image_files import ImageInput, caption_in_batches
from captioner.data.image_transform import ImageTransform
from captioner.core.decode_results import Caption
from captioner.models.checkpoint_format import checkpoint_spec, read_checkpoint
from captioner.models.model_paths import checkpoint_file, is_packaged, read_packaged
from captioner.models.decoder import Decoder, DecoderOutput, build_decoder, use_graphed_step
from captioner.models.decoders import lstm, transformer  # noqa: F401  (registers captioner's own decoders)
from captioner.models.decoding import DecodeOptions, SpecialTokens, decode_hypotheses
from captioner.models.encoders import (
    Encoder, build_encoder, check_packaged_weights, packaged_weights_record, weights_package,
)
from captioner.models.export_format import CONFIG, WEIGHTS, is_exported, read_exported, write_exported
from captioner.models.model_origin import ModelOrigin, checkpoint_origin, export_origin
from captioner.text.vocab import Vocabulary


class Captioner(nn.Module):
    """An image captioner with spatial attention: an encoder, a decoder and the `ModelSpec` describing
    them (vocabulary, preprocessing, decoding defaults; nothing about how it was trained)."""

    def __init__(self, encoder: Encoder, decoder: Decoder, spec: ModelSpec, decoder_config: Any = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self._spec = spec
        # The `model` section that builds it; `decoder_config`: the spec's decoder section, already read.
        self.config = ModelConfig(spec.encoder, decoder_config or spec.decoder_config(), spec.blind)
        self.vocab = Vocabulary(list(spec.vocab))
        self.transform = ImageTransform(spec.preprocessing.image_size)
        self.origin: ModelOrigin | None = None  # set by from_pretrained: what the caption paths say answered

    @property
    def image_size(self) -> int:
        return self._spec.preprocessing.image_size

    @property
    def decode_config(self) -> DecodeConfig:
        """Its decoding defaults (the spec's `decode` section)."""
        return self._spec.decode

    @decode_config.setter
    def decode_config(self, decode: DecodeConfig) -> None:
        self._spec = dataclasses.replace(self._spec, decode=decode)

    @classmethod
    def from_config(cls, config: Config, vocab: Vocabulary, load_pretrained: bool = True) -> Captioner:
        """The model `config` describes, with fresh weights (as `from_spec`)."""
        return cls.from_spec(ModelSpec.of(config, tuple(vocab.to_list())), load_pretrained)

    @classmethod
    def from_spec(cls, spec: ModelSpec, load_pretrained: bool = False) -> Captioner:
        """The model `spec` describes, with fresh weights (ImageNet's backbone with `load_pretrained`)."""
        encoder = build_encoder(spec.encoder, load_pretrained)
        decoder_config = spec.decoder_config()
        return cls(encoder, build_decoder(decoder_config, len(spec.vocab), encoder.out_dim), spec, decoder_config)

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "auto") -> Captioner:
        """A trained model in eval mode on `device` ("auto": a CUDA GPU if any) from any `checkpoint_file`
        path; only the spec is read, no ImageNet weights are fetched and nothing is unpickled."""
        name = str(path)
        path = checkpoint_file(path)
        if is_exported(path):
            packaged = is_packaged(path)
            sized = functools.partial(check_export_size, folder=path)  # before its weights are hashed or read
            exported = read_packaged(path, sized) if packaged else read_exported(path, size_check=sized)
            record = exported.config.get("encoder_weights")  # the encoder's weights left to its backbone's package
            model = cls.from_spec(exported.spec, load_pretrained=record is not None)
            model._load_weights(exported.state_dict, path / WEIGHTS, encoder_from_package=record is not None)
            model.origin = export_origin(path.name if packaged else name, exported.config, packaged)
        else:
            payload = read_checkpoint(path, for_inference=True)
            model = cls.from_checkpoint_payload(payload, path)
            model.origin = checkpoint_origin(name, payload["config"], path)
        return model.to(resolve_device(device)).eval()

    @classmethod
    def from_checkpoint_payload(cls, payload: dict[str, Any], source: Path) -> Captioner:
        """The model of a payload already read (`read_checkpoint(source)`), on the CPU."""
        spec = checkpoint_spec(payload, source)
        check_weights_bound(spec, payload["model"], source)
        model = cls.from_spec(spec)
        model._load_weights(payload["model"], source)
        return model

    def _load_weights(
        self, state_dict: dict[str, torch.Tensor], source: Path, encoder_from_package: bool = False
    ) -> None:
        """Load a state dict that must fit exactly (but for the encoder with `encoder_from_package`)."""
        try:
            missing, unexpected = self.load_state_dict(state_dict, strict=False)
        except RuntimeError as e:  # shape mismatches
            raise CheckpointError(f"{source}: weights do not fit the model its config describes "
                                  f"({str(e).splitlines()[1].strip()[:200]})") from None
        if encoder_from_package:
            if any(name.startswith("encoder.") for name in state_dict):
                raise CheckpointError(
                    f"{source}: holds encoder weights, but {CONFIG} says they come from the backbone's package"
                )
            missing = [name for name in missing if not name.startswith("encoder.")]
        if missing or unexpected:
            raise CheckpointError(
                f"{source}: weights do not match the model its config describes ({len(missing)} missing, "
                f"{len(unexpected)} unexpected, e.g. {', '.join((missing + unexpected)[:3])})"
            )

    def save_pretrained(
        self, folder: str | Path, *, encoder_from_package: bool = False, half_precision: bool = False,
        checksummed: Sequence[str] = (), **metadata_fields: Any,
    ) -> list[Path]:
        """Write this model as an exported folder (`export_format`), `metadata_fields` in config.json, weights
        in float16 with `half_precision`, the encoder's left to its package with `encoder_from_package`."""
        state_dict = self.state_dict()
        if encoder_from_package:
            record = self.packaged_encoder_record()
            if record is None:
                raise ExportError(f"{folder}: the encoder's weights are not its backbone's packaged ImageNet "
                                  "weights, frozen; an export without them could not rebuild them")
            state_dict = {name: t for name, t in state_dict.items() if not name.startswith("encoder.")}
            metadata_fields = {**metadata_fields, "encoder_weights": record}
        if half_precision:
            state_dict = {name: t.half() if t.is_floating_point() else t for name, t in state_dict.items()}
            metadata_fields = {**metadata_fields, "weights_dtype": "float16"}
        return write_exported(folder, state_dict, self.spec(self.grid_size()), metadata_fields, checksummed)

    def spec(self, grid: tuple[int, int] | None = None) -> ModelSpec:
        """What this model is, as every model file records it (`grid`: the encoder's, if known)."""
        statistics = self.encoder.normalize.statistics
        preprocessing = Preprocessing(self.image_size, tuple(statistics.mean), tuple(statistics.std))
        return dataclasses.replace(self._spec, preprocessing=preprocessing, grid=grid, feature_dim=self.encoder.out_dim)

    def packaged_encoder_record(self) -> dict[str, str] | None:
        """What an export records in place of the encoder's weights when they are its backbone
        package's ImageNet weights, frozen, bit for bit; else None."""
        encoder = self.config.encoder
        if not (encoder.pretrained and self.encoder.frozen and weights_package(encoder.name)):
            return None
        packaged = build_encoder(encoder, load_pretrained=True).state_dict()
        own = self.encoder.state_dict()
        if own.keys() != packaged.keys() or not all(torch.equal(own[name].cpu(), packaged[name]) for name in own):
            return None
        return packaged_weights_record(encoder.name)

    @property
    def origins(self) -> list[ModelOrigin | None]:
        """Where the model that answers came from (an ensemble has one per member)."""
        return [self.origin]

    @torch.no_grad()
    def grid_size(self) -> tuple[int, int]:
        """(h, w) of the encoder's grid at this model's input size."""
        probe = torch.zeros(1, 3, self.image_size, self.image_size, dtype=torch.uint8)  # (1, 3, S, S)
        was_training = self.training
        self.eval()
        try:
            return tuple(self.encoder(probe.to(self.device))[1])  # type: ignore[return-value]
        finally:
            self.train(was_training)

    def attention_shape(self) -> tuple[int, int]:
        """(layers, heads) of the attention maps its captions carry: (1, 1) for the LSTM."""
        return self.decoder.attention_shape

    def settings(self) -> dict:
        """The config sections that rebuild this model: model, input size and decoding defaults."""
        model = {**asdict(self.config), "decoder": section(self.config.decoder)}
        return {"model": model, "data": {"image_size": self.image_size}, "decode": asdict(self.decode_config)}

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.decoder.parameters()).dtype

    @property
    def special_tokens(self) -> SpecialTokens:
        """The vocabulary's `SpecialTokens`: <bos>, <eos>, the banned ids and the bad endings."""
        return SpecialTokens.of(self.vocab)

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, 3, H, W), uint8 from `self.transform` or normalised floats -> feats (B, N, D), grid (h, w)."""
        feats, grid = self.encoder(images)  # (B, N, D)
        return self.withhold_if_blind(feats), grid

    def stored_features(self, feats: torch.Tensor) -> torch.Tensor:
        """Rows of the store, (B, n, C) fp16 -> the decoder's input (B, N, D), as `encode` makes them."""
        feats, _ = self.encoder.from_stored(feats.to(self.dtype))  # (B, N, D)
        return self.withhold_if_blind(feats)

    def withhold_if_blind(self, feats: torch.Tensor) -> torch.Tensor:
        """A blind model (model.blind, the language-model baseline) sees zeros, not the image."""
        return torch.zeros_like(feats) if self.config.blind else feats

    def forward(
        self, images: torch.Tensor, tokens: torch.Tensor, image_rows: torch.Tensor | None = None,
        encoded: bool = False, lengths: torch.Tensor | None = None, packed: bool = False,
    ) -> DecoderOutput:
        """Teacher forcing (as `Decoder.forward`) on images (B, 3, H, W), or stored feats when `encoded`."""
        feats = self.stored_features(images) if encoded else self.encode(images)[0]  # (B, N, D)
        return self.decoder(feats, tokens, lengths, image_rows=image_rows, packed=packed)

    def decode_options(self, **overrides: Any) -> DecodeOptions:
        """This model's decoding defaults with `overrides` by name, checked (a one-line ConfigError)."""
        return DecodeOptions.from_config(self.decode_config, **overrides)

    @torch.no_grad()
    def decode(self, feats: torch.Tensor, grid: tuple[int, int], *, n_best: int | None = None,
               **options: Any) -> list[Caption] | list[list[Caption]]:
        """feats (B, N, D) -> per image its best caption, or with `n_best` its n best, best first;
        `options` are `DecodeOptions` fields by name (unset: the config's `decode` section)."""
        if self.decode_config.cuda_graphs and feats.device.type == "cuda":
            use_graphed_step(self.decoder)
        decoding = self.decode_options(n_best=n_best or 1, **options)
        ranked = decode_hypotheses(self.decoder, feats, self.special_tokens, decoding)
        captions = [[h.caption(self.vocab.decode_words(h.tokens), grid) for h in hyps] for hyps in ranked]
        return captions if n_best is not None else [best[0] for best in captions]

    def caption(
        self, images: ImageInput | Sequence[ImageInput] | torch.Tensor, *, n_best: int | None = None,
        batch_size: int | None = None, errors: str = "raise", on_picture: Callable[[Image], None] | None = None,
        **options: Any,
    ) -> Caption | list[Any]:
        """Caption an image (a path, bytes, a PIL image) -> a Caption, or a list of them -> a list in order
        (with `n_best`, each image's n best); a tensor (B, 3, S, S) is a transformed batch (docs/library.md)."""
        if isinstance(images, torch.Tensor) and images.dim() in (2, 4):  # (B, 3, S, S); an ensemble's (B, P)
            return self._caption_batch(images, n_best, options)
        return caption_in_batches(
            images, batch_size or self.decode_config.batch_size,
            lambda pictures: self._caption_batch(torch.stack([self.transform(p) for p in pictures]), n_best, options),
            n_best=n_best, errors=errors, on_picture=on_picture,
        )

    @torch.no_grad()
    def _caption_batch(self, images: torch.Tensor, n_best: int | None, options: dict[str, Any]) -> list:
        """Transformed images (B, 3, S, S) -> their captions, in eval mode whatever the model's mode."""
        was_training = self.training
        self.eval()
        try:
            feats, grid = self.encode(images.to(self.device))  # (B, N, D)
            return self.decode(feats, grid, n_best=n_best, **options)
        finally:
            self.train(was_training)


class _Oversized(Exception):
    """Raised inside a skeleton's construction once its weights pass the bound."""


class _Uninitialised(TorchFunctionMode):
    """Meta tensors left uninitialised: an in-place op on one (`normal_`, `uniform_`) returns it unchanged, where
    torch would run its Python reference, importing the compiler (a second of every caption's start) for nothing."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name, target = getattr(func, "__name__", ""), args[0] if args else next(iter(kwargs.values()), None)
        if name.endswith("_") and not name.startswith("_") and getattr(target, "is_meta", False):
            return target  # nn.init's functions pass the tensor by name
        return func(*args, **kwargs)


# Weights a skeleton may register beyond twice the file's (a backbone's dropped head), and a file may hold beyond
# its model's before it is read (closer misfits are `_load_weights`' to name)
SKELETON_MARGIN = 2**22


def check_export_size(spec: ModelSpec, config: dict[str, Any], held: int, folder: Path) -> None:
    """Refuse, by the header of an export's model.safetensors (`held` weights) and before the file is hashed or read,
    weights far more than the model its config.json describes has (a stranger's sparse file of a terabyte, its
    checksum recorded), or a model far larger than them (`check_weights_bound`); weights that do not fit exactly
    are `_load_weights`' to refuse, with what does not fit."""
    record = config.get("encoder_weights")  # the encoder's weights left to its backbone's package
    if record is not None:
        check_packaged_weights(record, spec.encoder, folder / CONFIG)
    needed = count_weights(spec, held, folder / CONFIG, record is not None)
    if held > needed + SKELETON_MARGIN:
        size = (folder / WEIGHTS).stat().st_size
        raise CheckpointError(f"{folder / WEIGHTS}: {size:,} bytes holding {held:,} weights, far more than the "
                              f"{needed:,} of the model {CONFIG} describes; refused before reading it")


def check_weights_bound(spec: ModelSpec, state_dict: dict[str, torch.Tensor], source: Path,
                        encoder_from_package: bool = False) -> None:
    """Refuse, before a weight is allocated, a model far larger than `state_dict` (`count_weights`)."""
    held = sum(tensor.numel() for tensor in state_dict.values() if isinstance(tensor, torch.Tensor))
    count_weights(spec, held, source, encoder_from_package)


def count_weights(spec: ModelSpec, held: int, source: Path, encoder_from_package: bool = False) -> int:
    """The weights of the model `spec` (read from `source`) describes, its whole state dict; refused, before a
    weight is allocated, when it names a backbone or statistics no registry knows, or describes a model far larger
    than the `held` weights of its file (a stranger's d_model of 10^9): its skeleton is built on the meta device,
    its weights counted as each layer registers them. Replaced and dropped ones count too (a tied output layer, a
    backbone's classifier), hence twice and a margin; weights that do not fit exactly are `_load_weights`' to
    refuse."""
    from torch.nn.modules.module import register_module_parameter_registration_hook

    bound, counted, owner = 2 * held + SKELETON_MARGIN, 0, threading.get_ident()

    def count(module: nn.Module, name: str, parameter: torch.Tensor | None) -> None:
        nonlocal counted
        if threading.get_ident() != owner:  # the hook is global: a model another thread builds meanwhile is not ours
            return
        counted += parameter.numel() if parameter is not None else 0
        if counted > bound:
            raise _Oversized

    handle = None
    try:
        with _Uninitialised(), torch.device("meta"):
            if encoder_from_package:  # a registered backbone, its weights its package's: not in the file
                bound += 2 * sum(p.numel() for p in build_encoder(spec.encoder, load_pretrained=False).parameters())
            handle = register_module_parameter_registration_hook(count)
            skeleton = Captioner.from_spec(spec)
    except ConfigError as e:
        raise CheckpointError(f"{source}: incompatible config: {e}") from None
    except _Oversized:
        raise CheckpointError(f"{source}: describes a model of far more weights than the {held:,} stored; "
                              "refused before allocating it") from None
    finally:
        if handle is not None:
            handle.remove()
    return sum(tensor.numel() for tensor in skeleton.state_dict().values())
