"""The demo's Gradio cache: one for each process that serves a page.

Gradio keeps uploads and examples in a cache folder, each file in a folder named by the hash of
its content, and a server that closes deletes every file it cached. In the shared /tmp/gradio two
processes that serve the same picture therefore share one file, and when one of them closes, the
other's upload or example is gone: its next caption of that picture is refused as a missing file.
So the first page built in a process gives the process a cache of its own (GRADIO_TEMP_DIR, which
Gradio reads when it builds a page and starts a server), unless the user chose one.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path


OWNER = "CAPTIONER_DEMO_CACHE_OWNER"  # "<process id> <folder>": the process whose private cache that is


def private_cache() -> Path | None:
    """Give this process a Gradio cache of its own, removed when the process exits, unless
    GRADIO_TEMP_DIR names one already: the user's choice, or this process's from an earlier
    call. A private cache inherited from the process that started this one is not this one's: a
    child that serves a page (a test's server in a subprocess) gets its own. Returns the new
    folder, None when there was one already."""
    chosen = os.environ.get("GRADIO_TEMP_DIR")
    owner, _, folder = os.environ.get(OWNER, "").partition(" ")
    if chosen and (folder != chosen or owner == str(os.getpid())):
        return None
    cache = Path(tempfile.mkdtemp(prefix="captioner-demo-cache-"))
    os.environ["GRADIO_TEMP_DIR"], os.environ[OWNER] = str(cache), f"{os.getpid()} {cache}"
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    return cache
