"""Datasets and collation: images and padded token tensors, robust to bad files in workers. The training order:
one shuffle per epoch from (seed, epoch), sharded over ranks, resumable from any batch; rank r takes every
world_size-th position from r (as DistributedSampler); items are (index, draw). Training preprocessing may run on
the device instead (`data.device_preprocess`), for nodes short of cores: `transform` runs the `ImageTransform`
there under each item's seed; `decode` also decodes the JPEGs there (nvjpeg)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from PIL import Image
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, Sampler

from captioner.core.errors import ImageLoadError
from captioner.core.process_settings import loader_workers
from captioner.data.image_files import MAX_PIXELS, decode_rgb, load_image, open_checked
from captioner.data.image_transform import ImageTransform, picture_tensor
from captioner.data.records import ImageRecord, image_data
from captioner.data.store_format import StoreRows
from captioner.text.vocab import Vocabulary

log = logging.getLogger(__name__)

DEVICE_MODES = ("RGB", "L")  # JPEG colour modes decode_jpeg turns into RGB itself
EXIF_ORIENTATION = 0x0112
PREPROCESS_CHOICES = ("none", "transform", "decode")  # data.device_preprocess
DRAW_LIMIT = 2**62  # draws are non-negative int64 seeds


@dataclass
class CaptionBatch:
    # (B, 3, H, W) uint8, stored features (B, N, D) fp16, or B pictures to transform on the device
    images: torch.Tensor | list[PendingImage]
    tokens: torch.Tensor  # (C, T) = <bos> w1 .. wn <eos> <pad> ..; C >= B captions
    lengths: torch.Tensor  # (C,) tokens before the padding, <bos> and <eos> included
    # (C,) the row of `images` each caption describes; None when caption c describes image c (one caption
    # per image, the images in the captions' order): the decoders then read each grid in place, uncopied.
    image_rows: torch.Tensor | None
    indices: torch.Tensor  # (B,) positions of the images in the dataset's records

    def to(self, device: torch.device, channels_last: bool = False) -> CaptionBatch:
        """The batch on `device`, non-blocking; `lengths` and `indices` stay on the CPU, read without a sync."""
        if isinstance(self.images, list):
            images = transform_on_device(self.images, device)  # (B, 3, H, W) uint8, decoded there
        else:
            images = self.images.to(device, non_blocking=True)
        if channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)  # (B, 3, H, W), NHWC in memory
        rows = None if self.image_rows is None else self.image_rows.to(device, non_blocking=True)
        return replace(self, images=images, tokens=self.tokens.to(device, non_blocking=True), image_rows=rows)

    def pin_memory(self) -> CaptionBatch:
        """Called by the DataLoader's pin-memory thread (pin_memory=True)."""
        images = self.images if isinstance(self.images, list) else self.images.pin_memory()
        rows = None if self.image_rows is None else self.image_rows.pin_memory()
        return replace(self, images=images, tokens=self.tokens.pin_memory(), image_rows=rows)


class CaptionDataset(Dataset):
    """Images with one random caption (`pairs="one"`) or all (`"all"`); a bad file yields None. For
    `dataset[(i, draw)]` the caption and augmentation come from `draw` alone, so a resume replays them."""

    def __init__(self, records: list[ImageRecord], vocab: Vocabulary, transform: ImageTransform, max_length: int,
                 pairs: str = "one", features: torch.Tensor | StoreRows | None = None,
                 device_preprocess: str = "none") -> None:
        self.records = records
        self.device_preprocess = device_preprocess  # one of PREPROCESS_CHOICES
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
            image = or_none(lambda: self.transform(load_record_image(self.records[i]), seed))
        return None if image is None else (image, captions, i)


class ImageDataset(Dataset):
    """Images alone, for encoding and decoding (evaluation, captioning, feature caching)."""

    def __init__(self, records: list[ImageRecord], transform: ImageTransform) -> None:
        self.records = records
        self.transform = transform

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int] | None:
        image = or_none(lambda: self.transform(load_record_image(self.records[i])))
        return None if image is None else (image, i)


T = TypeVar("T")


def or_none(load: Callable[[], T]) -> T | None:
    """`load()`, or None (with a warning naming the file) when the image fails to load."""
    try:
        return load()
    except ImageLoadError as e:
        log.warning("skipping image: %s", e)
        return None


def load_record_image(record: ImageRecord) -> Image.Image:
    """The record's picture, from its file or from the bytes its dataset stores."""
    return load_image(image_data(record), name=str(record.path))


def collate_captions(batch: list) -> CaptionBatch | None:
    batch = [item for item in batch if item is not None]
    if not batch:
        return None
    captions = [(row, ids) for row, (_, caps, _) in enumerate(batch) for ids in caps]
    captions.sort(key=lambda caption: -len(caption[1]))  # longest first, as the decoder wants them (stable)
    rows = [row for row, _ in captions]
    one_each = sorted(rows) == list(range(len(batch)))
    if one_each:  # a caption per image: the images take their captions' order, caption c describing image c
        batch = [batch[row] for row in rows]
    images = [image for image, _, _ in batch]
    if not isinstance(images[0], PendingImage):  # those are stacked on the device, once decoded there
        images = torch.stack(images)  # (B, 3, H, W) or (B, N, D)
    tokens = pad_sequence([torch.tensor(ids) for _, ids in captions], batch_first=True)  # (C, T) long, 0 = <pad>
    lengths = torch.tensor([len(ids) for _, ids in captions])  # (C,)
    image_rows = None if one_each else torch.tensor(rows)  # (C,)
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


def epoch_seed(seed: int, epoch: int, *more: int) -> int:
    """A 64-bit seed hashed from (seed, epoch, *more) by numpy's SeedSequence; `more`: a rank, a worker, a sample."""
    return int(np.random.SeedSequence([seed, epoch, *more]).generate_state(1, dtype=np.uint64)[0])


def rank_batch(size: int, batch_size: int, world_size: int = 1) -> int:
    """The images in each batch of one rank's epoch over `size` images (`EpochBatchSampler`): `batch_size`, or
    for a dataset smaller than the global batch its equal share, rounded up. What a step really holds, so what
    anything sized for a step (the precision's calibration) should be sized by."""
    return min(batch_size, -(-size // world_size))


class EpochBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batches of (index, draw) for one rank; `set_epoch(epoch, start)` picks the order and the first batch."""

    def __init__(self, size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if size <= 0:
            raise ValueError("the dataset is empty")
        self.size = size
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 1
        self.start = 0

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        """Batches per epoch: full global batches only, or one batch of everything for a smaller dataset."""
        return max(1, self.size // self.global_batch)

    @property
    def span(self) -> int:
        """Positions per global batch: the global batch, or a smaller dataset rounded up to equal shares."""
        return rank_batch(self.size, self.batch_size, self.world_size) * self.world_size

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        if not 0 <= start <= len(self):
            raise ValueError(f"start batch {start} is outside the epoch's {len(self)} batches")
        self.epoch, self.start = epoch, start

    def order(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The epoch's permutation and draws, both (len(self) * span,)."""
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        permutation = torch.randperm(self.size, generator=generator)  # (size,)
        draws = torch.randint(DRAW_LIMIT, (self.size,), generator=generator)  # (size,)
        needed = len(self) * self.span
        repeats = -(-needed // self.size)  # over 1: a small dataset shared by several ranks wraps to equal shares
        permutation, draws = permutation.repeat(repeats), draws.repeat(repeats)  # (repeats * size,)
        return permutation[:needed], draws[:needed]  # (needed,) each

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        permutation, draws = (t.tolist() for t in self.order(self.epoch))
        span = self.span
        for k in range(self.start, len(self)):
            positions = range(k * span + self.rank, (k + 1) * span, self.world_size)
            yield [(permutation[p], draws[p]) for p in positions]


@dataclass(frozen=True)
class EncodedJpeg:
    """A checked JPEG file's bytes, for the device to decode."""

    data: torch.Tensor  # (L,) uint8: the file as stored
    orientation: int  # EXIF orientation: 1 (as stored) to 8
    name: str


def read_for_device(path: str | Path | bytes, ship_jpeg: bool = True, max_pixels: int = MAX_PIXELS,
                    name: str | None = None) -> EncodedJpeg | torch.Tensor:
    """In a worker: with `ship_jpeg`, a checked baseline RGB or grey JPEG as its bytes and EXIF orientation; any
    other file (progressive JPEGs too: nvjpeg may refuse them) decoded as `load_image` does, uint8 (3, H, W)."""

    def finish(image: Image.Image) -> EncodedJpeg | torch.Tensor:
        if not ship_jpeg or image.format != "JPEG" or image.mode not in DEVICE_MODES or image.info.get("progressive"):
            return picture_tensor(decode_rgb(image))  # (3, H, W)
        encoded = path if isinstance(path, bytes) else Path(path).read_bytes()
        data = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)  # (L,)
        return EncodedJpeg(data, exif_orientation(image), name or str(path))

    return open_checked(path, finish, max_pixels, name)


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation tag, 1 when absent, out of range or unreadable (as `upright` treats it)."""
    try:
        value = image.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - damaged EXIF leaves the picture as stored, as in `upright`
        return 1
    return value if value in range(1, 9) else 1


# EXIF orientation -> what turns an image (C, H, W) as stored upright, as PIL's `ImageOps.exif_transpose` does
UPRIGHT: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    2: lambda image: image.flip(-1),  # mirrored left-right
    3: lambda image: image.flip(-2, -1),  # rotated 180
    4: lambda image: image.flip(-2),  # mirrored top-bottom
    5: lambda image: image.transpose(-2, -1),  # (C, W, H): transposed
    6: lambda image: image.rot90(-1, dims=(-2, -1)),  # (C, W, H): turned 90 degrees clockwise
    7: lambda image: image.transpose(-2, -1).flip(-2, -1),  # (C, W, H): transverse
    8: lambda image: image.rot90(1, dims=(-2, -1)),  # (C, W, H): turned 90 degrees counter-clockwise
}


def orient(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """image (C, H, W) as stored -> upright (orientation 1 and unknown ones: as stored)."""
    return UPRIGHT[orientation](image) if orientation in UPRIGHT else image


def decode_jpegs(images: list[EncodedJpeg], device: torch.device | str) -> list[torch.Tensor]:
    """Decode on `device` in one call as upright RGB, uint8 (3, H, W) each; if it fails (naming no file),
    each alone, falling back to `load_image`, whose `ImageLoadError` names a corrupt file."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        decoded = decode_jpeg([item.data for item in images], mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return [decode_one(item, device) for item in images]
    return [orient(image, item.orientation) for image, item in zip(decoded, images)]


def decode_one(item: EncodedJpeg, device: torch.device | str) -> torch.Tensor:
    """One JPEG on `device`, or through PIL's `load_image` when the device refuses it -> uint8 (3, H, W)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        return orient(decode_jpeg(item.data, mode=ImageReadMode.RGB, device=device), item.orientation)
    except RuntimeError:
        return picture_tensor(load_image(item.name)).to(device)  # (3, H, W)


def gpu_jpeg_decoding(device: torch.device) -> bool:
    """Whether `device` decodes JPEGs itself: CUDA, with torchvision's nvjpeg kernels built in (torchvision loads
    here, where it may be used: a CPU run never needs it)."""
    if device.type != "cuda":
        return False
    import torchvision.io  # noqa: F401 - registers torch.ops.image

    return hasattr(torch.ops.image, "decode_jpegs_cuda")


def device_preprocess(requested: str, device: torch.device) -> str:
    """What `data.device_preprocess` does on `device`: "none" off CUDA, `transform` without nvjpeg."""
    if device.type != "cuda":
        return "none"
    return "transform" if requested == "decode" and not gpu_jpeg_decoding(device) else requested


@dataclass(frozen=True)
class PendingImage:
    """A training item whose transform (and decoding) wait for the device (CaptionBatch.to)."""

    source: EncodedJpeg | torch.Tensor  # a JPEG to decode there, or the uint8 (3, H, W) picture decoded
    transform: ImageTransform
    seed: int | None  # the item's augmentation seed (CaptionDataset's draw); None: the process's RNG


def transform_on_device(pending: list[PendingImage], device: torch.device | str) -> torch.Tensor:
    """The device half of the loader: decode on `device`, then each item's transform under its seed -> (B, 3, S, S)."""
    jpegs = [item.source for item in pending if isinstance(item.source, EncodedJpeg)]
    decoded = iter(decode_jpegs(jpegs, device) if jpegs else [])
    images = []
    for item in pending:
        image = next(decoded) if isinstance(item.source, EncodedJpeg) else item.source.to(device)  # (3, H, W)
        images.append(item.transform(image, item.seed))  # (3, S, S), on the device; crop and jitter from the CPU RNG
    return torch.stack(images)  # (B, 3, S, S)
