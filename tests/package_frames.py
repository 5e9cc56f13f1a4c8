"""Which frame of a stack is the package's own: the tests that blame a device read on a line of
captioner ask this, wherever the checkout lies.

A frame belongs to the package when its file, resolved, lies inside the folder of the captioner
that was imported (resolved too: `runtime/captioner` is a link to it). A word in the path proves
nothing: a checkout that `git clone` names `captioner` puts every test helper under `/captioner/`.
"""

from __future__ import annotations

import functools
import traceback
from pathlib import Path

import captioner

PACKAGE = Path(captioner.__file__).resolve().parent


@functools.lru_cache(maxsize=4096)
def in_package(filename: str, package: Path = PACKAGE) -> bool:
    """Whether the file named by a frame lies inside `package`, links resolved."""
    if filename.startswith("<"):  # <frozen ...>, <string>: no file of ours
        return False
    return Path(filename).resolve().is_relative_to(package)


def package_caller(stack: list[traceback.FrameSummary] | None = None, package: Path = PACKAGE) -> str | None:
    """`file.py:line` of the innermost frame of `stack` (now: the caller's) inside the package, or None."""
    frames = traceback.extract_stack() if stack is None else stack
    frame = next((f for f in reversed(frames) if in_package(f.filename, package)), None)
    return f"{Path(frame.filename).name}:{frame.lineno}" if frame else None
