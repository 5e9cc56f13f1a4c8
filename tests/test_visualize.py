"""Attention figures: one panel for the input and one per word, counted on the saved file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import count_panels
from PIL import Image

from captioner.models.caption import Caption
from captioner.viz.overlays import save_attention_figure


def caption_of(words: list[str], grid: int = 4) -> Caption:
    torch.manual_seed(len(words))
    attn = torch.rand(len(words), 1, 1, grid, grid).softmax(-1)  # (T, L, H, h, w)
    return Caption(" ".join(words), words, list(range(len(words))), -1.0, -1.0, attn, True)


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    rng = np.random.default_rng(0)
    base = np.full((96, 96, 3), 255, dtype=np.uint8)  # a white background: the hard case for counting
    base[20:60, 30:70] = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
    return Image.fromarray(base)


@pytest.mark.parametrize("n", [1, 4, 5, 7, 12])
def test_figure_has_the_input_and_one_panel_per_word(photo: Image.Image, tmp_path: Path, n: int) -> None:
    words = [f"w{i}" for i in range(n)]
    path = save_attention_figure(tmp_path / "fig.png", photo, caption_of(words))
    assert count_panels(path) == n + 1


def test_panel_counter_sees_a_missing_panel(photo: Image.Image, tmp_path: Path) -> None:
    """What a figure that dropped a word's panel looks like to the counter: one panel fewer."""
    path = save_attention_figure(tmp_path / "fig.png", photo, caption_of(["a", "red", "circle"]))
    pixels = np.asarray(Image.open(path).convert("RGB")).copy()
    counted = count_panels(path)
    # white out the rightmost panel's columns (the last word's heatmap)
    ink = (pixels.min(axis=2) < 245).mean(axis=0) > 0.2  # (W,) columns through panels
    columns = np.nonzero(ink)[0]
    last_start = columns[np.nonzero(np.diff(columns) > 1)[0][-1] + 1]
    pixels[:, last_start:] = 255
    Image.fromarray(pixels).save(tmp_path / "cut.png")
    assert counted == 4 and count_panels(tmp_path / "cut.png") == 3
