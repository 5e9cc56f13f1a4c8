"""The demo's Gradio cache: one for each process that serves a page.

Gradio names cached files by content hash and a closing server deletes its files, so in a shared
cache one server closing would delete another's uploads; each process gets its own GRADIO_TEMP_DIR.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path


OWNER = "CAPTIONER_DEMO_CACHE_OWNER"  # "<process id> <folder>": the process whose private cache that is


def private_cache() -> Path | None:
    """Give this process a Gradio cache of its own, removed at exit, unless GRADIO_TEMP_DIR names the
    user's or this process's own (one inherited from a parent does not count). The new folder, or None."""
    chosen = os.environ.get("GRADIO_TEMP_DIR")
    owner, _, folder = os.environ.get(OWNER, "").partition(" ")
    if chosen and (folder != chosen or owner == str(os.getpid())):
        return None
    cache = Path(tempfile.mkdtemp(prefix="captioner-demo-cache-"))
    os.environ["GRADIO_TEMP_DIR"], os.environ[OWNER] = str(cache), f"{os.getpid()} {cache}"
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    return cache
