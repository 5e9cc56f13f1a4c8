"""Where captioner keeps what it computes once per machine (measured speed decisions, METEOR's
paraphrase index): $CAPTIONER_CACHE_DIR, else $XDG_CACHE_HOME/captioner, else ~/.cache/captioner."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("CAPTIONER_CACHE_DIR"):
        return Path(os.environ["CAPTIONER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "captioner"
