"""Where the benchmarks find the real data this machine cannot download: $CAPTIONER_SHARED_DATA,
else the `shared/data` folder beside the repository (../shared/data from its root)."""

from __future__ import annotations

import os
from pathlib import Path

SHARED_DATA = Path(os.environ.get("CAPTIONER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
