"""The Gradio demo: caption an image and show, word by word, where the model looked.
Modules import one way (decoding <- batcher <- page <- ui <- server, inputs <- ui); the names below load their
module on first use."""

from __future__ import annotations

import importlib
import os
from typing import Any

# Offline: no telemetry, no version check (network calls at startup); set before any module imports Gradio.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

_MODULES = {  # name importable from the package -> the module that defines it
    **dict.fromkeys(("Result", "PageOutput", "caption_page", "render_page"), "page"),
    **dict.fromkeys(("dataset_examples", "load_models", "model_card", "model_examples"), "cards"),
    **dict.fromkeys(("Callbacks", "build_demo"), "ui"),
    **dict.fromkeys(("default_checkpoint", "launch", "close", "serve"), "server"),
}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULES])
