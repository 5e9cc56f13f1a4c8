"""Checking a /caption request: every value must be one the page's own controls could send.

Gradio's range checks guard the page, not the API: a beam of 10,000 would hold the server for everyone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from captioner.apps.demo.choices import MEAN, attention_choices
from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.errors import RequestError
from captioner.models.captioner import Captioner

# The sliders' ranges: what core/decode_schema.py lets a public page serve.
MAX_BEAM = int(DECODE_OPTIONS["beam_size"].served.le)  # type: ignore[union-attr]
MAX_LENGTH = int(DECODE_OPTIONS["max_length"].served.le)  # type: ignore[union-attr]


@dataclass(frozen=True)
class Request:
    """A checked /caption request: values the page's own controls could have sent."""

    model_name: str
    beam_size: int
    max_length: int
    layer: str | None
    head: str


def served(name: str, value: Any) -> Any:
    """A decoding option's value within what the page serves (sliders send floats, so 3.0 is
    3; 2.5, NaN, True and "3" are refused), or `RequestError` with the option's refusal."""
    option = DECODE_OPTIONS[name]
    if not option.allows(value, served=True):
        raise RequestError(option.refusal(value, served=True))
    return option.converted(value)


def menu_value(value: Any) -> str | None:
    """A dropdown value as the menu's string ("2" for 2), None for no choice."""
    if value is None or value == "":
        return None
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else repr(value)


def check_request(
    models: dict[str, Captioner], model_name: Any, beam_size: Any, max_length: Any, layer: Any, head: Any
) -> Request:
    """Check every value of a /caption request against what the page offers, or raise `RequestError`
    naming it. Left out: the first model, the last layer, the mean of heads."""
    if model_name in (None, ""):
        model_name = next(iter(models))
    if not isinstance(model_name, str) or model_name not in models:
        raise RequestError(f"unknown model {str(model_name)[:80]!r}: choose one of the menu's models")
    model = models[model_name]
    beam, length = served("beam_size", beam_size), served("max_length", max_length)
    layers, heads = attention_choices(model)
    layer, head = menu_value(layer), menu_value(head) or MEAN
    if layer is not None and layer not in layers:
        raise RequestError(f"decoder layer must be one of {', '.join(layers)} for this model, got {layer[:20]!r}")
    if head not in heads:
        raise RequestError(f"attention head must be one of {', '.join(heads)} for this model, got {head[:20]!r}")
    return Request(model_name, beam, length, layer, head)
