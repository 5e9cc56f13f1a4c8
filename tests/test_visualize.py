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
    """A panel per head asked and one for their mean: a line from word t to input j for each causal weight over
    0.02, its opacity and width growing with the weight; the panels named as the caller counts."""
    from captioner.viz.head_views import TITLE_SIZE, head_view_layout

    caption = transformer_caption(["a", "red", "circle", "left", "of", "it"])
    layout = head_view_layout(caption, [1], [0, 1], first=1)
    weights = caption.self_attn[:, 1]  # (T, H, T): layer 1
    T = weights.shape[0]
    rows = {y: t for t, y in enumerate(sorted({text.y for text in layout.texts if text.anchor == "rm"}))}
    assert len(rows) == T
    for lines, w in zip(layout.panels, (weights[:, 0], weights[:, 1], weights.mean(dim=1)), strict=True):
        shown = [(t, j, float(w[t, j])) for t in range(T) for j in range(t + 1) if w[t, j] > 0.02]
        assert [(rows[line.start[1]], rows[line.end[1]]) for line in lines] == [(t, j) for t, j, _ in shown]
        assert np.allclose([line.width for line in lines], [0.4 + 3.6 * v for _, _, v in shown])
        assert np.allclose([line.alpha for line in lines], [min(1.0, 0.15 + 0.85 * v) for _, _, v in shown])
    titles = [text.text for text in layout.texts if text.size == TITLE_SIZE]
    assert titles == ["layer 2, head 1", "layer 2, head 2", "layer 2, mean"]


def test_the_head_view_picture_and_svg_draw_the_same_lines_and_words(tmp_path: Path) -> None:
    """The picture has the head's colour along its strongest line; the SVG parses, with a line element per line
    and every word, escaped."""
    import xml.etree.ElementTree as ET

    from captioner.viz.head_views import head_colours, head_view_layout, head_view_picture, save_head_view

    caption = transformer_caption(["a", "<red>", "circle", "&", "it"])
    layout = head_view_layout(caption, [0], [1])  # one panel: layer 0, head 1
    picture = np.asarray(head_view_picture(layout), dtype=float)  # (H, W, 3)
    assert picture.shape[:2] == (layout.height, layout.width)
    [lines] = layout.panels
    strongest = max(lines, key=lambda line: line.weight)
    x, y = [round((a + b) / 2) for a, b in zip(strongest.start, strongest.end)]
    drawn = picture[y - 1:y + 2, x - 1:x + 2].reshape(-1, 3)  # (9, 3) around the line's middle
    expected = strongest.alpha * np.array(head_colours()[1]) + (1 - strongest.alpha) * 255
    assert np.abs(drawn - expected).sum(axis=1).min() < 40
    png, svg = save_head_view(tmp_path / "view", caption)  # every layer and head, and each layer's mean
    whole = head_view_layout(caption)
    root = ET.parse(svg).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    layers, heads = caption.self_attn.shape[1:3]
    assert len(whole.panels) == layers * (heads + 1)
    assert len(root.findall(f"{ns}line")) == sum(len(panel) for panel in whole.panels)
    texts = [element.text for element in root.findall(f"{ns}text")]
    assert "<red>" in texts and "&" in texts and texts.count("layer 1, mean") == 1
    with Image.open(png) as saved:
        assert saved.size == (int(root.get("width")), int(root.get("height"))) == (whole.width, whole.height)


def test_the_head_grid_draws_a_map_per_layer_and_head_and_their_mean(tmp_path: Path) -> None:
    from captioner.viz.head_views import GRID_PANEL_SIDE, head_grid_picture

    photo = Image.new("RGB", (600, 400), (90, 120, 40))
    caption = transformer_caption(["a", "red", "circle"], layers=2, heads=2)
    one_word, other_word = head_grid_picture(photo, caption, [1]), head_grid_picture(photo, caption, [2])
    one_word.save(tmp_path / "one.png")
    head_grid_picture(photo, caption).save(tmp_path / "all.png")
    assert count_panels(tmp_path / "one.png") == 2 * 3 and count_panels(tmp_path / "all.png") == 3 * 2 * 3
    assert one_word.size == other_word.size and one_word.width < 4 * GRID_PANEL_SIDE
    assert np.abs(np.asarray(one_word, float) - np.asarray(other_word, float)).mean() > 0.5
    assert photo.size == (600, 400)  # the caller's picture untouched
