"""A seeded train/val/test split for datasets that come without one (an image folder, a Hugging
Face dataset with a single split): the same images and seed always give the same split."""

from __future__ import annotations

import random

from captioner.core.errors import DatasetError
from captioner.data.shapes import SPLITS  # the project's three split names, declared once


def held_out_count(total: int, fraction: float) -> int:
    """round(total x fraction), but at least one image when the fraction is not 0 and there are
    three images or more (a tiny folder still gets something to validate on)."""
    if fraction <= 0:
        return 0
    return max(1, round(total * fraction)) if total >= 3 else 0


def seeded_split(total: int, val_fraction: float, test_fraction: float, seed: int,
                 source: str) -> dict[str, list[int]]:
    """Positions 0..total-1 -> {train, val, test: sorted positions}: a seeded shuffle, the first
    `test` of it for testing, the next `val` for validation, the rest for training."""
    order = list(range(total))
    random.Random(seed).shuffle(order)
    test = held_out_count(total, test_fraction)
    val = held_out_count(total, val_fraction)
    if total - test - val < 1:
        raise DatasetError(f"{source}: {total} images leave none for training after {val} for validation "
                           f"and {test} for testing")
    return {"test": sorted(order[:test]), "val": sorted(order[test : test + val]), "train": sorted(order[test + val :])}


def check_split_name(split: str, source: str) -> None:
    if split not in SPLITS:
        raise DatasetError(f"{source}: unknown split {split!r}: use train, val or test")
