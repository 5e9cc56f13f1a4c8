"""The layer, head and word menus: what they offer for a model, and their values as indices.

A menu value left over from another model (or sent through the API) is clamped to the caption's
own maps, so it never indexes out of range.
"""

from __future__ import annotations

from typing import Any

from captioner.models.caption_result import Caption
from captioner.models.captioner import Captioner

MEAN = "mean"  # the head choice that averages the heads


def attention_shape(model: Captioner) -> tuple[int, int]:
    """(layers, heads) of the decoder's attention maps: (1, 1) for the LSTM."""
    return model.attention_shape()


def attention_choices(model: Captioner) -> tuple[list[str], list[str]]:
    """Dropdown choices: layers "1".."L" (default the last) and heads "mean", "1".."H"."""
    layers, heads = attention_shape(model)
    return [str(i + 1) for i in range(layers)], [MEAN, *(str(i + 1) for i in range(heads))]


def menus(model: Captioner) -> tuple[dict[str, Any], dict[str, Any]]:
    """Layer and head menu settings (last layer, mean of heads); hidden for one map per word."""
    layers, heads = attention_choices(model)
    visible = len(layers) > 1 or len(heads) > 2
    return ({"choices": layers, "value": layers[-1], "visible": visible},
            {"choices": heads, "value": MEAN, "visible": visible})


def parse_layer_head(caption: Caption, layer: str | int | None, head: str | int | None) -> tuple[int, int | None]:
    """Dropdown values -> (layer index, head index or None for the mean), clamped to the caption's
    maps, so a choice left over from another model never indexes out of range."""
    num_layers, num_heads = caption.attn.shape[1:3]
    try:
        layer_index = min(max(int(layer) - 1, 0), num_layers - 1)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        layer_index = num_layers - 1
    try:
        head_index: int | None = int(head) - 1  # type: ignore[arg-type]
    except (TypeError, ValueError):
        head_index = None
    if head_index is not None and not 0 <= head_index < num_heads:
        head_index = None
    return layer_index, head_index


def maps_label(caption: Caption, layer: int, head: int | None) -> str:
    """'layer 2, head 1' for a multi-layer or multi-head decoder; '' when there is one map a word."""
    if caption.attn.shape[1] == 1 and caption.attn.shape[2] == 1:
        return ""
    return f"layer {layer + 1}, " + ("mean of heads" if head is None else f"head {head + 1}")


def word_choices(caption: Caption) -> list[str]:
    """The word menu: "1: a", "2: red", ... (numbered, since a word can occur twice)."""
    return [f"{i + 1}: {w}" for i, w in enumerate(caption.words)]


def word_position(caption: Caption, word: str | None) -> int:
    """A word menu value "3: circle" -> 2; anything else -> the first word."""
    try:
        position = int(str(word).split(":", 1)[0]) - 1
    except ValueError:
        return 0
    return position if 0 <= position < len(caption.words) else 0
