"""A split's stored features for training and evaluation, built when absent, on disk or on the device."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from captioner.core.config_sections import Config
from captioner.core.files import size_text
from captioner.data.records import ImageRecord
from captioner.data.store_extract import ensure_store
from captioner.data.store_format import EncodesImages, StoreEncoder, store_dir
from captioner.data.store_reader import StoreRows, open_store

log = logging.getLogger(__name__)


@torch.no_grad()
def output_grid(encoder: StoreEncoder, image_size: int) -> tuple[int, int]:
    """The grid (h, w) of the encoder's output at `image_size`, probed in eval mode (no batch-norm update)."""
    training = encoder.training
    encoder.eval()
    _, grid = encoder(torch.zeros(1, 3, image_size, image_size, device=encoder.device))  # (1, N, D)
    encoder.train(training)
    return grid


@dataclass
class SplitFeatures:
    """A split's stored features: the records kept, their rows (on disk or a tensor), the encoder's grid."""

    records: list[ImageRecord]
    features: torch.Tensor | StoreRows
    grid: tuple[int, int]


def split_features(model: EncodesImages, config: Config, split: str, records: list[ImageRecord],
                   use: list[ImageRecord] | None = None, build: bool = True) -> SplitFeatures:
    """The stored features of `use` (default: `records`), built if absent (`build`); on the device if they fit."""
    data, encoder, transform = config.data, model.encoder, model.transform
    device = encoder.device
    if build:
        store = ensure_store(encoder, transform, store_dir(config), split, records, data.batch_size, data.num_workers)
    else:
        store = open_store(store_dir(config), split, encoder, transform, records)
    kept, rows = store.rows_of(records if use is None else use)
    # Fine-tuned top blocks pool the trunk's cells: their own grid.
    grid = store.grid if encoder.frozen else output_grid(encoder, transform.image_size)
    if store.failed_rows:
        log.warning("%s: %d images failed to load at extraction and are skipped (%s)", split, len(store.failed_rows),
                    store.manifest_path)
    if data.features_on_device:
        need = len(rows) * store.row_bytes
        free = free_memory(device)
        if need < 0.9 * free:
            log.info("%s: %s of features loaded onto %s", split, size_text(need), device)
            return SplitFeatures(kept, store.load(rows, device), grid)
        log.warning("%s: data.features_on_device is set but %s of features do not fit in the %s free on %s; "
                    "reading from disk", split, size_text(need), size_text(free), device)
    return SplitFeatures(kept, store.rows(rows), grid)


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
