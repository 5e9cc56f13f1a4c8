"""The scores file: overall and per-image scores as JSON, with what produced them."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from captioner.core.files import write_atomically


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None  # NaN is not JSON


def write_scores_json(path: str | os.PathLike[str], overall: Mapping[str, float],
                      per_image: Mapping[int, Mapping[str, float]], extra: Mapping[str, Any] | None = None) -> None:
    """Write `{**extra, "overall": {...}, "num_images": n, "per_image": [{"image_id", ...}]}`, per-image
    entries by image id (as COCOEvalCap's `evalImgs`), non-finite scores null, atomically."""
    extra = dict(extra or {})
    clash = {"overall", "num_images", "per_image"} & extra.keys()
    if clash:
        raise ValueError(f"extra must not use the keys {sorted(clash)}")
    document = {
        **extra,
        "overall": {key: _json_number(float(value)) for key, value in overall.items()},
        "num_images": len(per_image),
        "per_image": [
            {"image_id": image_id, **{k: _json_number(float(v)) for k, v in per_image[image_id].items()}}
            for image_id in sorted(per_image)
        ],
    }
    text = json.dumps(document, indent=1) + "\n"
    write_atomically(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))  # a full disk keeps the old file


def rounded(scores: Mapping[str, float]) -> dict[str, float]:
    """Scores to 4 decimals, as reports print and return them (the scores file keeps every digit)."""
    return {key: round(value, 4) for key, value in scores.items()}
