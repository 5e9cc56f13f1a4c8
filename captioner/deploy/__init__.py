"""Captioning without PyTorch: an exported model's ONNX encoder and decoder step, run by
onnxruntime with numpy and Pillow alone (beam search, greedy decoding, attention maps). Nothing
here imports torch; an import-linter contract in pyproject.toml holds it to that.

    from captioner.deploy import OnnxCaptioner
    model = OnnxCaptioner.from_folder("export/")    # written by `captioner export CKPT export/ --onnx`
    model.caption("photo.jpg", beam_size=3).text

The names below are imported on first use, so `import captioner.deploy` loads no onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from captioner.deploy.runtime import OnnxCaption, OnnxCaptioner

_PUBLIC = {"OnnxCaption": "captioner.deploy.runtime", "OnnxCaptioner": "captioner.deploy.runtime"}
__all__ = ["OnnxCaption", "OnnxCaptioner"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'captioner.deploy' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
