"""The feature store's format: what an encoder's frozen blocks make, kept on disk in fp16. A `<split>.json`
manifest names the encoder, transform and images, so a store made otherwise is refused in one line."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torchvision.transforms import v2

from captioner.core.config_sections import Config, EncoderConfig
from captioner.core.errors import ConfigError, FeatureStoreError
from captioner.core.files import write_atomically
from captioner.data.image_transform import IMAGENET, ImageTransform, PixelNormalization
from captioner.data.records import ImageRecord

FORMAT = "captioner-feature-store"
VERSION = 1
DTYPE = np.float16


def store_dir(config: Config) -> Path:
    """Where the store of `config` lives: `data.feature_store`, else `<train.out_dir>/features`."""
    return Path(config.data.feature_store or Path(config.train.out_dir) / "features")


def store_files(directory: str | Path, split: str) -> tuple[Path, Path]:
    directory = Path(directory)
    return directory / f"{split}.npy", directory / f"{split}.json"


class StoreEncoder(Protocol):
    """What the store needs of an encoder: a frozen part mapping uint8 (B, 3, S, S) to cells (B, n, C), its grid."""

    config: EncoderConfig
    normalize: PixelNormalization
    training: bool  # nn.Module's mode flag

    @property
    def frozen(self) -> bool: ...

    @property
    def storable(self) -> bool: ...

    @property
    def device(self) -> torch.device: ...

    def __call__(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]: ...

    def stored_part(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]: ...

    def frozen_state_dict(self) -> Mapping[str, torch.Tensor]: ...

    def eval(self) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...


class EncodesImages(Protocol):
    """What holds an encoder and the transform of its images (a Captioner does)."""

    @property
    def encoder(self) -> StoreEncoder: ...

    @property
    def transform(self) -> ImageTransform: ...


def encoder_fingerprint(encoder: StoreEncoder) -> str:
    """A hash of the frozen part's state dict (names, shapes, dtypes, values): what the stored rows depend on."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in encoder.frozen_state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data if tensor.numel() else b"")
    return digest.hexdigest()


def input_pipeline(encoder: StoreEncoder, transform: ImageTransform) -> list[str]:
    """Every step from the decoded picture to the encoder's input, as the objects that run them state them."""
    return [*transform.describe(), *encoder.normalize.describe()]


def identity(encoder: StoreEncoder, transform: ImageTransform) -> dict[str, Any]:
    """What the features depend on besides the images, in the order a store's fields are compared."""
    config = encoder.config
    return {
        "encoder.name": config.name,
        "encoder.pretrained": config.pretrained,
        "encoder.grid_size": config.grid_size,
        "encoder.fine_tune_blocks": config.fine_tune_blocks,
        "encoder.fingerprint": encoder_fingerprint(encoder),
        "image_size": transform.image_size,
        "transform": input_pipeline(encoder, transform),  # the pipeline's steps: a changed one makes the store stale
    }


def check_storable(encoder: StoreEncoder) -> None:
    if not encoder.storable:
        raise ConfigError("model.encoder: a feature store needs some frozen blocks (pretrained: true, "
                          f"fine_tune_blocks >= 0 and fewer than the backbone's blocks); every block of "
                          f"{encoder.config.name} here trains, so nothing it makes is fixed")


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """A .npy file's shape, dtype and where its rows start, from its header alone."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            return shape, dtype, f.tell()
    except (OSError, ValueError) as e:
        raise FeatureStoreError(f"{path}: not a readable feature array ({str(e)[:120]})") from None


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FeatureStoreError(f"{path}: not a readable feature store manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FeatureStoreError(f"{path}: not a captioner feature store manifest")
    if manifest.get("version") != VERSION:
        raise FeatureStoreError(f"{path}: store format version {manifest.get('version')} is not supported "
                                f"(this code reads {VERSION})")
    return manifest


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(manifest)))  # never half a manifest


# An older store's transform: torchvision's tensor resize, a level off Pillow's on some pixels (refused).
LEGACY_TRANSFORM = {"resize": "square", "antialias": True, "mean": [0.485, 0.456, 0.406],
                    "std": [0.229, 0.224, 0.225]}


def stored_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's identity with an older store's transform named as the current code names its steps."""
    stored = dict(manifest["identity"])
    if stored.get("transform") == LEGACY_TRANSFORM and "image_size" in stored:
        size = stored["image_size"]
        tensor_resize = [repr(v2.PILToTensor()), repr(v2.Resize((size, size), antialias=True))]
        stored["transform"] = [*tensor_resize, *IMAGENET.describe()]
    return stored


def check_manifest(manifest_path: Path, manifest: dict[str, Any], expected: dict[str, Any],
                   records: list[ImageRecord]) -> None:
    """Refuse, in one line naming the file and the field, a store made otherwise or for other images."""
    hint = f"delete {manifest_path.parent} or set data.feature_store to another folder"
    stored = stored_identity(manifest)
    for key, value in expected.items():
        if stored.get(key) != value:
            raise FeatureStoreError(f"{manifest_path}: {key} is {stored.get(key)!r} in the store but {value!r} here; "
                                    f"{hint}")
    stored, wanted = manifest["image_ids"], [r.image_id for r in records]
    if stored != wanted:
        stored_set, wanted_set = set(stored), set(wanted)
        missing = [i for i in stored if i not in wanted_set]
        extra = [i for i in wanted if i not in stored_set]
        detail = (f"{len(missing)} of its images are no longer in the split (e.g. image {missing[0]}, "
                  f"{manifest['paths'][stored.index(missing[0])]})" if missing
                  else f"the split has {len(extra)} images it lacks (e.g. image {extra[0]})" if extra
                  else "the images are in another order")
        raise FeatureStoreError(f"{manifest_path}: image_ids differ from the {manifest['split']} split: "
                                f"{detail}; {hint}")
