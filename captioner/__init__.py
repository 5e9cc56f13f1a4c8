"""captioner: image captioning with spatial attention.

    from captioner import Captioner, default_model
    model = Captioner.from_pretrained("runs/shapes_lstm")        # a run folder, a .pt, an export folder or a Hub id
    # runs/default_model, else the packaged model, else runs/shapes_lstm
    model = default_model()
    caption = model.caption("photo.jpg", beam_size=3)
    caption.text, caption.words, caption.heatmaps()              # (T, h, w) attention per word
    captions = model.caption(["a.jpg", "b.png"])                 # a list in, a list out

The names below are imported on first use (PEP 562), so `import captioner` alone loads neither
torch nor anything else: the command line starts fast, and `captioner.__version__` is free.
See docs/library.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from captioner.core.decode_results import Caption
    from captioner.models.captioner import Captioner
    from captioner.models.checkpoint import default_model, load_captioner
    from captioner.models.decoding import DecodeOptions

__version__ = "0.1.0"

_PUBLIC = {
    "Caption": "captioner.core.decode_results",
    "Captioner": "captioner.models.captioner",
    "DecodeOptions": "captioner.models.decoding",
    "default_model": "captioner.models.checkpoint",
    "load_captioner": "captioner.models.checkpoint",
}
__all__ = ["Caption", "Captioner", "DecodeOptions", "default_model", "load_captioner"]  # the keys of _PUBLIC


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'captioner' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # found once; later lookups never come back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
