"""The Gradio demo: caption an image and show, word by word, where the model looked.

One job per module, importing one way (choices <- checks, batcher, page_figures <- page <- ui <- server):

- `choices`: the layer, head and word menus, and their values as map indices;
- `checks`: every value of a /caption request checked against what the page offers;
- `batcher`: the images of concurrent requests decoded as one batch;
- `page_figures`: the page's figure files (the downloadable attention figure, pruned when old) and
  the transformer views;
- `page`: captioning an upload and laying out the page (no Gradio: testable without a server);
- `cards`: the served models, their labels, cards and example images;
- `ui`: the Gradio page, its callbacks, its bounded queue and the cleanup of its files;
- `server`: the default checkpoint, starting and stopping the server; `serve()` is `captioner demo`.

The names below are importable from the package itself (`from captioner.apps.demo import
serve`); each loads its module on first use, so importing the page logic alone loads no Gradio.
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
