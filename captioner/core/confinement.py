"""Whether a place someone else named stays inside the folder it must, compared by real paths.

Both are resolved, links and all, so a link pointing outside is no way out. For names from a model's
settings or a dataset's listing; the user's own places are followed, not judged here.
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
    """Names checked against one folder, each folder resolved once (one lstat a file)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = str(folder)
        self.base = os.path.realpath(self.folder)
        self._folders: dict[str, str] = {}

    def escape(self, name: str | Path) -> str | None:
        """Where `name` (relative or absolute) leads when that is outside the folder, else None."""
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
