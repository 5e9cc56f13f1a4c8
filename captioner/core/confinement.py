"""Whether a place someone else named stays inside the folder it must, compared by real paths:
the folder and the place are both resolved, links and all, so a link inside the folder that
points outside it is no way out. A lexical check (no absolute path, no `..`) comes first, where the
caller has one; this one sees what the file system does with the name.

What someone else names: a model's stored settings (against the working folder), the file names
of a dataset's own listing (metadata.csv/jsonl, a Hugging Face dataset's image paths, against the
dataset's folder). The user's own places (a data.root on the command line that is a link to a
dataset disk) and a model's own files (links into the Hugging Face cache's blob store) are not
judged here: they are followed.
"""

from __future__ import annotations

import os
from pathlib import Path


def is_within(path: str, base: str) -> bool:
    """Whether real path `path` is `base` or lies below it (both already resolved)."""
    try:
        return os.path.commonpath([path, base]) == base
    except ValueError:  # another drive
        return False


class Confinement:
    """Names checked against one folder: the folder resolved once, each name's own folder once,
    so a listing of many files in few folders costs one lstat a file."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = str(folder)
        self.base = os.path.realpath(self.folder)
        self._folders: dict[str, str] = {}

    def escape(self, name: str | Path) -> str | None:
        """Where `name` (relative to the folder, or absolute) leads once resolved, when that is
        outside the folder; None when it stays inside."""
        head, tail = os.path.split(os.path.join(self.folder, name))
        real_head = self._folders.get(head)
        if real_head is None:
            real_head = self._folders[head] = os.path.realpath(head)
        target = os.path.join(real_head, tail)
        if os.path.islink(target):
            target = os.path.realpath(target)
        return None if is_within(target, self.base) else target


def escapes(name: str | Path, folder: str | Path) -> str | None:
    """`Confinement(folder).escape(name)`, for one name."""
    return Confinement(folder).escape(name)
