"""User-facing errors: a `CaptionerError` is one line naming the problem, the file or field and the way
out; `captioner` prints it and exits 2, as it does for a missing package that an optional install (extra,
pyproject.toml) or captioner's own brings. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
import sys


class CaptionerError(Exception):
    """Base class for errors caused by user input, reported as one line."""


class ImageLoadError(CaptionerError):
    """An image file is missing, corrupt, truncated, not an image, or too large."""


class DatasetError(CaptionerError):
    """A dataset or annotation file is missing or malformed."""


class ConfigError(CaptionerError):
    """A config file or override names an unknown key or an invalid value."""


class CheckpointError(CaptionerError):
    """A checkpoint is missing, corrupt, or incompatible with this version."""


class FeatureStoreError(CaptionerError):
    """A feature store is missing, unfinished, made for another encoder or images, or too big for the disk."""


class RequestError(CaptionerError):
    """A demo request carries a value outside what the page offers (beam, length, model, ...)."""


class ExportError(CaptionerError):
    """An export lacks a file, has one that fails its config or checksum, or is of another version; or a
    Hub repo id cannot be reached."""


class StorageError(CaptionerError):
    """A file could not be written (a full disk, a size limit, a quota); the file it names is left as it was."""


class DivergedError(CaptionerError):
    """Training's loss stopped being a finite number: the weights diverged; the checkpoints written before stay."""


# What torch's C++ checks append to their messages: a request to torch's developers, not the user's
TORCH_REQUEST = re.compile(r"\s*\(Could this error message be improved\?.*\)\s*$")


def first_line(error: BaseException, limit: int = 200) -> str:
    """An exception's message for a one-line error: its first line (without torch's plea for a better message), cut
    to `limit`; its type's name if it has none."""
    text = str(error).strip()
    line = TORCH_REQUEST.sub("", text.splitlines()[0]) if text else ""
    return line[:limit] if line else type(error).__name__


# The optional install (extra, pyproject.toml) that brings each package
EXTRA_OF = {
    "pycocoevalcap": "train", "pycocotools": "train", "nltk": "train", "tensorboard": "train",
    "regex": "train", "joblib": "train",  # nltk's own dependencies: an nltk installed without them fails on import
    "gradio": "demo", "gradio_client": "demo",
    "onnx": "onnx", "onnxscript": "onnx", "onnxruntime": "onnx",
    "datasets": "data", "pyarrow": "data", "webdataset": "data",
}


# The modules of the packages `pip install captioner` brings itself (pyproject.toml's dependencies): one missing
# means a Python that is not the project's, as in a checkout whose environment is not active
OWN_PACKAGES = frozenset({"torch", "torchvision", "numpy", "PIL", "yaml", "tqdm", "matplotlib", "safetensors",
                          "huggingface_hub"})


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """The one-line message for a package an optional install brings, or captioner's own install; None for any other
    (keep the traceback)."""
    package = (error.name or "").split(".")[0]
    if package in OWN_PACKAGES:
        return (f"{package} is not installed in {sys.executable}: captioner needs it (pip install captioner; in a "
                "checkout, bash scripts/setup.sh, then source .venv/bin/activate)")
    extra = EXTRA_OF.get(package)
    if extra is None:
        return None
    return (f"{package} is not installed: it comes with the '{extra}' extra "
            f"(pip install 'captioner[{extra}]', or -e '.[{extra}]' in a checkout)")
