"""Where the benchmarks find the real data sets they read (Flickr8k's photos, COCO's caption
files), which they do not download: $CAPTIONER_SHARED_DATA, else a `shared/data` folder beside
the repository."""

from __future__ import annotations

import os
from pathlib import Path

SHARED_DATA = Path(os.environ.get("CAPTIONER_SHARED_DATA",
                                  Path(__file__).resolve().parents[2] / "shared" / "data"))
FLICKR8K_PHOTOS = SHARED_DATA / "flickr8k" / "images"  # the Flickr8k release's photographs
