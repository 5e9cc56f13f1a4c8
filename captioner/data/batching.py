"""Datasets and collation: images and padded token tensors, robust to bad files in workers."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import torch
from PIL import Image
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from captioner.core.errors import ImageLoadError
from captioner.core.process_settings import loader_workers
from captioner.data.device_decode import PendingImage, read_for_device, transform_on_device
from captioner.data.image_files import load_image
from captioner.data.image_transform import ImageTransform
from captioner.data.records import ImageRecord, image_data
from captioner.text.vocab import Vocabulary

log = logging.getLogger(__name__)


@dataclass
class CaptionBatch:
    # (B, 3, H, W) uint8, stored features (B, N, D) fp16, or B pictures to transform on the device
    images: torch.Tensor | list[PendingImage]
    tokens: torch.Tensor  # (C, T) = <bos> w1 .. wn <eos> <pad> ..; C >= B captions
    lengths: torch.Tensor  # (C,) tokens before the padding, <bos> and <eos> included
    image_rows: torch.Tensor  # (C,) the row of `images` each caption describes
    indices: torch.Tensor  # (B,) positions of the images in the dataset's records

    def to(self, device: torch.device, channels_last: bool = False) -> CaptionBatch:
        """The batch on `device`, non-blocking; `lengths` and `indices` stay on the CPU, read without a sync."""
        if isinstance(self.images, list):
            images = transform_on_device(self.images, device)  # (B, 3, H, W) uint8, decoded there
        else:
            images = self.images.to(device, non_blocking=True)
        if channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)  # (B, 3, H, W), NHWC in memory
        return replace(self, images=images, tokens=self.tokens.to(device, non_blocking=True),
                       image_rows=self.image_rows.to(device, non_blocking=True))

    def pin_memory(self) -> CaptionBatch:
        """Called by the DataLoader's pin-memory thread (pin_memory=True)."""
        images = self.images if isinstance(self.images, list) else self.images.pin_memory()
        return replace(self, images=images, tokens=self.tokens.pin_memory(), image_rows=self.image_rows.pin_memory())


class FeatureRows(Protocol):
    """Stored encoder outputs, one (N, D) row per record: a tensor, or the feature store's rows."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> torch.Tensor: ...


class CaptionDataset(Dataset):
    """Images with one random caption (`pairs="one"`) or all (`"all"`); a bad file yields None. For
    `dataset[(i, draw)]` the caption and augmentation come from `draw` alone, so a resume replays them."""

    def __init__(self, records: list[ImageRecord], vocab: Vocabulary, transform: ImageTransform, max_length: int,
                 pairs: str = "one", features: FeatureRows | None = None, device_preprocess: str = "none") -> None:
        self.records = records
        self.device_preprocess = device_preprocess  # one of device_decode.PREPROCESS_CHOICES
        self.transform = transform
        self.pairs = pairs
        self.features = features  # row i: image i's stored (N, D) grid, when the encoder is frozen
        self.tokens = [[vocab.encode(c, max_length) for c in r.captions] for r in records]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key: int | tuple[int, int]
                    ) -> tuple[torch.Tensor | PendingImage, list[list[int]], int] | None:
        i, draw = key if isinstance(key, tuple) else (key, None)
        choices = self.tokens[i]
        if self.pairs == "all":
            captions = choices
        else:
            captions = [random.choice(choices) if draw is None else choices[draw % len(choices)]]
        seed = draw if self.transform.train and self.transform.augment else None  # None: the process's RNG
        if self.features is not None:
            image = self.features[i]
        elif self.device_preprocess != "none":  # read and checked (or decoded) here, transformed on the device
            record, ship_jpeg = self.records[i], self.device_preprocess == "decode"
            image = or_none(lambda: PendingImage(read_for_device(image_data(record), ship_jpeg, name=str(record.path)),
                                                 self.transform, seed))
        else:
            image = load_or_none(self.records[i], self.transform, seed)
        return None if image is None else (image, captions, i)


class ImageDataset(Dataset):
    """Images alone, for encoding and decoding (evaluation, captioning, feature caching)."""

    def __init__(self, records: list[ImageRecord], transform: ImageTransform) -> None:
        self.records = records
        self.transform = transform

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int] | None:
        image = load_or_none(self.records[i], self.transform)
        return None if image is None else (image, i)


T = TypeVar("T")


def or_none(load: Callable[[], T]) -> T | None:
    """`load()`, or None (with a warning naming the file) when the image fails to load."""
    try:
        return load()
    except ImageLoadError as e:
        log.warning("skipping image: %s", e)
        return None


def load_or_none(record: ImageRecord, transform: ImageTransform, seed: int | None = None) -> torch.Tensor | None:
    return or_none(lambda: transform(load_record_image(record), seed))


def load_record_image(record: ImageRecord) -> Image.Image:
    """The record's picture, from its file or from the bytes its dataset stores."""
    return load_image(image_data(record), name=str(record.path))


def collate_captions(batch: list) -> CaptionBatch | None:
    batch = [item for item in batch if item is not None]
    if not batch:
        return None
    images = [image for image, _, _ in batch]
    if not isinstance(images[0], PendingImage):  # those are stacked on the device, once decoded there
        images = torch.stack(images)  # (B, 3, H, W) or (B, N, D)
    captions = [(row, ids) for row, (_, caps, _) in enumerate(batch) for ids in caps]
    captions.sort(key=lambda caption: -len(caption[1]))  # longest first, as the decoder wants them (stable)
    tokens = pad_sequence([torch.tensor(ids) for _, ids in captions], batch_first=True)  # (C, T) long, 0 = <pad>
    lengths = torch.tensor([len(ids) for _, ids in captions])  # (C,)
    image_rows = torch.tensor([row for row, _ in captions])  # (C,)
    indices = torch.tensor([i for _, _, i in batch])  # (B,)
    return CaptionBatch(images, tokens, lengths, image_rows, indices)


def collate_images(batch: list) -> tuple[torch.Tensor, torch.Tensor] | None:
    batch = [item for item in batch if item is not None]
    if not batch:
        return None
    return torch.stack([image for image, _ in batch]), torch.tensor([i for _, i in batch])  # (B, 3, H, W), (B,)


def image_loader(records: list[ImageRecord], transform: ImageTransform, batch_size: int,
                 num_workers: int = 0) -> DataLoader:
    # The loader's worker seed comes from its own generator, not from training's RNG.
    return DataLoader(ImageDataset(records, transform), batch_size=batch_size, shuffle=False,
                      num_workers=loader_workers(num_workers), collate_fn=collate_images, persistent_workers=False,
                      generator=torch.Generator())
