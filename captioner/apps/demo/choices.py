"""The layer, head and word menus, and the check of a /caption request against what they offer.
A request must hold values the page's own controls could send: Gradio's range checks guard the page, not the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.errors import RequestError
from captioner.core.decode_results import Caption
from captioner.models.captioner import Captioner

MEAN = "mean"  # the head choice that averages the heads
# The sliders' ranges: what core/decode_schema.py lets a public page serve.
MAX_BEAM = int(DECODE_OPTIONS["beam_size"].served.le)  # type: ignore[union-attr]
MAX_LENGTH = int(DECODE_OPTIONS["max_length"].served.le)  # type: ignore[union-attr]


def attention_choices(model: Captioner) -> tuple[list[str], list[str]]:
    """Dropdown choices: layers "1".."L" (default the last) and heads "mean", "1".."H"."""
    layers, heads = model.attention_shape()
    return [str(i + 1) for i in range(layers)], [MEAN, *(str(i + 1) for i in range(heads))]


def menus(model: Captioner) -> tuple[dict[str, Any], dict[str, Any]]:
    """Layer and head menu settings (last layer, mean of heads); hidden for one map per word."""
    layers, heads = attention_choices(model)
    visible = len(layers) > 1 or len(heads) > 2
    return ({"choices": layers, "value": layers[-1], "visible": visible},
            {"choices": heads, "value": MEAN, "visible": visible})


def parse_layer_head(caption: Caption, layer: str | int | None, head: str | int | None) -> tuple[int, int | None]:
    """Dropdown values -> (layer index, head index or None for the mean), clamped to the caption's maps."""
    num_layers, num_heads = caption.attn.shape[1:3]
    try:
        layer_index = min(max(int(layer) - 1, 0), num_layers - 1)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        layer_index = num_layers - 1
    try:
        head_index = int(head) - 1  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return layer_index, None
    return layer_index, head_index if 0 <= head_index < num_heads else None


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


@dataclass(frozen=True)
class Request:
    """A checked /caption request: values the page's own controls could have sent."""

    model_name: str
    beam_size: int
    max_length: int
    layer: str | None
    head: str


def served(name: str, value: Any) -> Any:
    """A decoding option's value within what the page serves (3.0 is 3; 2.5, NaN, True, "3" are a RequestError)."""
    option = DECODE_OPTIONS[name]
    if not option.allows(value, served=True):
        raise RequestError(option.refusal(value, served=True))
    return option.converted(value)


def menu_value(value: Any) -> str | None:
    """A dropdown value as the menu's string ("2" for 2), None for no choice."""
    if value is None or value == "":
        return None
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else repr(value)


def check_request(models: dict[str, Captioner], model_name: Any, beam_size: Any, max_length: Any, layer: Any,
                  head: Any) -> Request:
    """Every value of a /caption request checked against what the page offers, or `RequestError` naming it."""
    if model_name in (None, ""):
        model_name = next(iter(models))
    if not isinstance(model_name, str) or model_name not in models:
        raise RequestError(f"unknown model {str(model_name)[:80]!r}: choose one of the menu's models")
    beam, length = served("beam_size", beam_size), served("max_length", max_length)
    layers, heads = attention_choices(models[model_name])
    layer, head = menu_value(layer), menu_value(head) or MEAN
    if layer is not None and layer not in layers:
        raise RequestError(f"decoder layer must be one of {', '.join(layers)} for this model, got {layer[:20]!r}")
    if head not in heads:
        raise RequestError(f"attention head must be one of {', '.join(heads)} for this model, got {head[:20]!r}")
    return Request(model_name, beam, length, layer, head)
