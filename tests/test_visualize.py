"""Attention figures: one panel for the input and one per word, counted on the saved file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import count_panels
from PIL import Image

from captioner.core.decode_results import Caption
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


@pytest.mark.parametrize("suffix, kind", [(".png", "PNG"), (".jpg", "JPEG"), (".jpeg", "JPEG")])
def test_the_figure_takes_its_format_from_its_suffix_and_a_jpeg_keeps_its_labels(
        photo: Image.Image, tmp_path: Path, suffix: str, kind: str) -> None:
    """A JPEG figure (the demo's, or `--heatmaps fig.jpg`) at quality 95: Pillow's default, 75, blurs the words."""
    path = save_attention_figure(tmp_path / f"fig{suffix}", photo, caption_of(["a", "red", "circle"]))
    with Image.open(path) as saved:
        assert saved.format == kind and count_panels(path) == 4
        if kind == "JPEG":
            reference = tmp_path / "q95.jpg"
            saved.convert("RGB").save(reference, quality=95)
            with Image.open(reference) as q95:
                assert saved.quantization == q95.quantization  # the tables quality 95 writes


def transformer_caption(words: list[str], layers: int = 2, heads: int = 2, grid: int = 3) -> Caption:
    """A caption as a transformer decodes it: maps per layer and head, and its self-attention."""
    torch.manual_seed(0)
    T = len(words)
    attn = torch.rand(T, layers, heads, grid * grid).softmax(-1).view(T, layers, heads, grid, grid)  # (T, L, H, h, w)
    self_attn = torch.rand(T, layers, heads, T).tril_().div_(T)  # (T, L, H, T), causal
    return Caption(" ".join(words), words, list(range(T)), -1.0, -1.0, attn, True, self_attn)


def test_caption_figures_are_written_as_requested(photo: Image.Image, tmp_path: Path) -> None:
    from captioner.viz.caption_figures import FigureRequest, save_caption_figures

    caption = transformer_caption(["a", "red", "circle"])
    cams = {t: torch.rand(3, 3) for t in range(3)}  # (h, w) per word position
    everything = FigureRequest(heatmaps=tmp_path / "maps", self_attention=tmp_path / "heads",
                               head_grid=tmp_path / "grid",
                               gradcam=tmp_path / "maps")
    written = save_caption_figures(photo, caption, everything, "photo", "_2", cams)
    assert {kind: path.relative_to(tmp_path).as_posix() for kind, path in written.items()} == {
        "heatmaps": "maps/photo_attention_2.png", "self_attention": "heads/photo_self_attention_2.png",
        "head_grid": "grid/photo_heads_2.png", "gradcam": "maps/photo_gradcam_2.png",
    }
    assert all(path.is_file()
               for path in written.values()) and (tmp_path / "heads" / "photo_self_attention_2.svg").is_file()
    assert count_panels(written["heatmaps"]) == 4  # the input and one map per word
    assert count_panels(written["gradcam"]) == 6  # per word: attention above Grad-CAM
    # only what is asked; no Grad-CAM figure without the maps; an empty caption has no per-word figure
    assert save_caption_figures(photo, caption, FigureRequest(head_grid=tmp_path / "g2"),
                                "p") == {"head_grid": tmp_path / "g2" / "p_heads.png"}
    assert save_caption_figures(photo, caption, FigureRequest(gradcam=tmp_path / "g3"), "p") == {}
    empty = transformer_caption([])
    assert set(save_caption_figures(photo, empty, everything, "empty", cams={})) == {"heatmaps"}
    assert everything.per_word and not FigureRequest(heatmaps=tmp_path).per_word


def test_the_head_view_draws_a_line_for_each_weight_that_shows() -> None:
    """One collection a panel: a segment from word t to input j for each causal weight over 0.02, its opacity
    and width growing with the weight, for each head asked and their mean."""
    import matplotlib.pyplot as plt

    from captioner.viz.caption_figures import head_view_figure

    caption = transformer_caption(["a", "red", "circle", "left", "of", "it"])
    fig = head_view_figure(caption, [1], [0, 1])
    weights = caption.self_attn[:, 1]  # (T, H, T): layer 1
    T = weights.shape[0]
    try:
        for ax, w in zip(fig.axes, (weights[:, 0], weights[:, 1], weights.mean(dim=1)), strict=True):
            shown = [(t, j, float(w[t, j])) for t in range(T) for j in range(t + 1) if w[t, j] > 0.02]
            [lines] = ax.collections
            assert [(round(a[1]), round(b[1])) for a, b in lines.get_segments()] == [(t, j) for t, j, _ in shown]
            assert np.allclose(lines.get_linewidths(), [0.3 + 3 * v for _, _, v in shown])
            assert np.allclose(lines.get_edgecolor()[:, 3], [min(1.0, 0.15 + 0.85 * v) for _, _, v in shown])
    finally:
        plt.close(fig)


def test_the_head_grid_draws_its_maps_over_a_picture_of_the_panels_size() -> None:
    import matplotlib.pyplot as plt

    from captioner.viz.caption_figures import GRID_PICTURE_SIDE, head_grid_figure

    photo = Image.new("RGB", (600, 400), (90, 120, 40))
    fig = head_grid_figure(photo, transformer_caption(["a", "red", "circle"]), [1])
    try:
        sizes = {ax.images[0].get_array().shape[:2] for ax in fig.axes}  # (H, W) of each panel's picture
        assert sizes == {(round(GRID_PICTURE_SIDE * 400 / 600), GRID_PICTURE_SIDE)} and len(fig.axes) == 2 * 3
    finally:
        plt.close(fig)
    assert photo.size == (600, 400)  # the caller's picture untouched
