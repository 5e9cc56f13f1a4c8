"""Which optional install (extra, pyproject.toml) brings which package.

A command that reaches a package its install left out stops with one line naming the extra.
"""

from __future__ import annotations

EXTRA_OF = {
    "pycocoevalcap": "train", "pycocotools": "train", "nltk": "train", "tensorboard": "train",
    "regex": "train", "joblib": "train",  # nltk's own dependencies: an nltk installed without them fails on import
    "gradio": "demo", "gradio_client": "demo",
    "onnx": "onnx", "onnxscript": "onnx", "onnxruntime": "onnx",
    "datasets": "data", "pyarrow": "data", "webdataset": "data",
}


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """The one-line message for a package an optional install brings; None for any other (keep the traceback)."""
    package = (error.name or "").split(".")[0]
    extra = EXTRA_OF.get(package)
    if extra is None:
        return None
    return (
        f"{package} is not installed: it comes with the '{extra}' extra "
        f"(pip install 'captioner[{extra}]', or -e '.[{extra}]' in a checkout)"
    )
