"""Captioning without PyTorch: an exported model's ONNX graphs run by onnxruntime with numpy and
Pillow alone (an import-linter contract keeps torch out). `OnnxCaptioner.from_folder("export/")`
(see runtime.py); the names are imported on first use, so `import captioner.deploy` loads no onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from captioner.deploy.runtime import OnnxCaption, OnnxCaptioner

__all__ = ["OnnxCaption", "OnnxCaptioner"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'captioner.deploy' has no attribute {name!r}")
    return getattr(importlib.import_module("captioner.deploy.runtime"), name)
