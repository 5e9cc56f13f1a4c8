"""The Gradio demo: caption an image and show, word by word, where the model looked.

Modules import one way: choices <- checks, batcher, page_figures <- page <- ui <- server. The names
below import from the package (`from captioner.apps.demo import serve`), each loading its module on
first use, so the page logic alone loads no Gradio.
"""

from __future__ import annotations

import os
from typing import Any

# The demo must start offline: no telemetry, no version check (both are network calls at
# startup). Set here, before any module of the package can import Gradio.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

# Names importable from the package, by the module that defines them.
_PAGE = ("Result", "PageOutput", "caption_page", "render_page")
_CARDS = ("dataset_examples", "load_models", "model_card", "model_examples")
_UI = ("Callbacks", "build_demo")
_SERVER = ("default_checkpoint", "launch", "close", "serve")


def __getattr__(name: str) -> Any:
    if name in _PAGE:
        from captioner.apps.demo import page as module
    elif name in _CARDS:
        from captioner.apps.demo import cards as module
    elif name in _UI:
        from captioner.apps.demo import ui as module
    elif name in _SERVER:
        from captioner.apps.demo import server as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_PAGE, *_CARDS, *_UI, *_SERVER])
