"""How sure is a gain? A paired bootstrap over the test images of two `captioner evaluate` runs. It
is Koehn's, for metrics whose corpus score is the mean of the per-image scores (CIDEr-D, ROUGE-L,
SPICE); per-image scores are resampled, not recomputed (CIDEr-D keeps the whole split's idf)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from captioner.core.errors import CaptionerError
from captioner.data.records import is_number
from captioner.evaluation.results_files import read_scores_file

MEAN_METRICS = ("CIDEr", "ROUGE_L", "SPICE")  # corpus score = mean of the per-image scores


@dataclass(frozen=True)
class PairedGain:
    base: float  # corpus score of the base run over all images
    new: float
    gain: float  # new / base - 1
    low: float  # the gain's central interval over the bootstrap draws
    high: float
    p_positive: float  # share of draws where the new run scores higher
    p_goal: float | None  # share of draws where the gain reaches `goal`
    images: int
    samples: int


def per_image_scores(path: str | Path, metric: str) -> dict[int, float]:
    """image id -> `metric` from a scores JSON that `captioner evaluate` wrote; checked to be one
    whose corpus score is the mean of these."""
    if metric not in MEAN_METRICS:
        raise CaptionerError(f"metric {metric!r}: a per-image bootstrap needs a metric whose corpus score "
                             f"is the mean of its per-image scores ({', '.join(MEAN_METRICS)})")
    report = read_scores_file(path, "captioner evaluate CHECKPOINT --out DIR writes scores_<split>.json")
    rows = report.get("per_image")
    if not isinstance(rows, list) or not rows:
        raise CaptionerError(f"{path}: no 'per_image' scores (written by captioner evaluate with the official metrics)")
    try:
        scores = {int(row["image_id"]): float(row[metric]) for row in rows}
    except (KeyError, TypeError, ValueError, OverflowError):
        raise CaptionerError(f"{path}: 'per_image' rows lack an image_id or a numeric {metric!r}") from None
    if not all(map(math.isfinite, scores.values())):
        raise CaptionerError(f"{path}: 'per_image' holds a {metric!r} that is not a finite number (NaN or infinite)")
    overall = report.get("overall")
    overall = overall.get(metric) if isinstance(overall, dict) else None
    if overall is not None and not (is_number(overall) and math.isfinite(overall)):
        raise CaptionerError(f"{path}: overall.{metric} is {overall!r}, not a finite number")
    if overall is not None and abs(np.mean(list(scores.values())) - overall) > 1e-6:
        raise CaptionerError(f"{path}: the per-image {metric} scores do not average to the overall {overall:.6f}")
    return scores


def paired_bootstrap(base: dict[int, float], new: dict[int, float], samples: int = 10_000, seed: int = 0,
                     interval: float = 0.95, goal: float | None = None) -> PairedGain:
    """The relative gain of `new` over `base` (image id -> score, the same images), with its
    bootstrap interval and the share of draws that favour `new` (and that reach `goal`)."""
    if base.keys() != new.keys():
        only = sorted(base.keys() ^ new.keys())
        raise CaptionerError(f"the two runs scored different images ({len(only)} in one only, "
                             f"e.g. image id {only[0]}): compare runs on the same split")
    ids = sorted(base)
    a = np.array([base[i] for i in ids])  # (I,)
    b = np.array([new[i] for i in ids])  # (I,)
    if a.mean() <= 0:
        raise CaptionerError("the base run scores 0: a relative gain is undefined")
    try:
        draws = np.random.default_rng(seed).integers(0, len(ids), size=(samples, len(ids)))  # (S, I) image indices
        base_means, new_means = a[draws].mean(axis=1), b[draws].mean(axis=1)  # (S,) each
    except MemoryError:
        raise CaptionerError(f"{samples:,} draws of {len(ids):,} images do not fit in memory; "
                             "ask for fewer samples") from None
    gains = new_means / np.maximum(base_means, np.finfo(float).tiny) - 1  # (S,)
    tail = 100 * (1 - interval) / 2
    return PairedGain(base=float(a.mean()), new=float(b.mean()), gain=float(b.mean() / a.mean() - 1),
                      low=float(np.percentile(gains, tail)), high=float(np.percentile(gains, 100 - tail)),
                      p_positive=float(np.mean(new_means > base_means)),
                      p_goal=None if goal is None else float(np.mean(gains >= goal)), images=len(ids), samples=samples)
