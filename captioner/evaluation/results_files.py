"""The files of an evaluation: a COCO annotation (reference) file and a results file, read and checked (every
mistake is one DatasetError naming the file and record, so a wrong file never scores silently), and the
scores file: overall and per-image scores as JSON, with what produced them."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from captioner.core.bounded_files import read_scores_json
from captioner.core.errors import CaptionerError, DatasetError
from captioner.core.files import write_atomically
from captioner.data.records import is_int, is_number, read_json

References = dict[int, list[str]]
"""Image id -> its reference (human) captions."""
Predictions = dict[int, str]
"""Image id -> the one predicted caption."""
# Characters a caption of either file may have: a model's are a few dozen words and a person's a sentence, while
# METEOR's Java fails without a word on one of some hundreds of thousands, after the whole evaluation's wait.
MAX_CAPTION_CHARS = 10_000


def load_references(path: str | os.PathLike[str]) -> References:
    """Read a COCO caption annotation file (`{"annotations": [{"image_id": int, "caption": str, ...}]}`;
    "images" is optional) into image id -> reference captions."""
    path = Path(path)
    data = read_json(path, "annotation file")
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: expected a COCO caption annotation object, got a JSON {type(data).__name__}")
    annotations = data.get("annotations")
    if annotations is None:
        raise DatasetError(f'{path}: missing "annotations" (not a COCO caption annotation file?)')
    if not isinstance(annotations, list):
        raise DatasetError(f'{path}: "annotations" must be a list, got {type(annotations).__name__}')
    if "images" in data and not isinstance(data["images"], list):
        raise DatasetError(f'{path}: "images" must be a list, got {type(data["images"]).__name__}')
    references: References = {}
    for i, ann in enumerate(annotations):
        if not isinstance(ann, dict):
            raise DatasetError(f"{path}: annotations[{i}] is not an object")
        for field in ("image_id", "caption"):
            if field not in ann:
                raise DatasetError(f'{path}: annotations[{i}] has no "{field}"')
        if not is_int(ann["image_id"]):
            raise DatasetError(f'{path}: annotations[{i}]: "image_id" must be an integer, got {ann["image_id"]!r}')
        if not isinstance(ann["caption"], str):
            raise DatasetError(f'{path}: annotations[{i}]: "caption" must be a string, got {ann["caption"]!r}')
        check_length(ann["caption"], f"{path}: annotations[{i}]")
        references.setdefault(ann["image_id"], []).append(ann["caption"])
    if not references:
        raise DatasetError(f"{path}: no caption annotations")
    return references


def check_length(caption: str, where: str) -> None:
    """A caption longer than any a person or a model writes is one DatasetError naming `where`."""
    if len(caption) > MAX_CAPTION_CHARS:
        raise DatasetError(f"{where}: a caption of {len(caption):,} characters, more than the {MAX_CAPTION_CHARS:,} "
                           "one may have")


def load_results(path: str | os.PathLike[str], references: Mapping[int, list[str]]) -> Predictions:
    """Read a COCO results file (`[{"image_id": int, "caption": str}, ...]`), checked against the
    annotations: every image must be annotated, appear once, and have a non-empty caption."""
    path = Path(path)
    data = read_json(path, "results file")
    expected = 'a JSON list of {"image_id": int, "caption": str} objects'
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected {expected}, got a JSON {type(data).__name__}")
    if not data:
        raise DatasetError(f"{path}: no results (empty list)")
    predictions: Predictions = {}
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise DatasetError(f"{path}: item {i} is a {type(item).__name__}, expected {expected}")
        for field in ("image_id", "caption"):
            if field not in item:
                raise DatasetError(f'{path}: item {i} has no "{field}" (expected {expected})')
        image_id, caption = item["image_id"], item["caption"]
        if not is_int(image_id):
            raise DatasetError(f'{path}: item {i}: "image_id" must be an integer, got {image_id!r}')
        if not isinstance(caption, str):
            raise DatasetError(f'{path}: item {i} (image {image_id}): "caption" must be a string, got {caption!r}')
        if not caption.strip():
            raise DatasetError(f"{path}: item {i} (image {image_id}) has an empty caption")
        check_length(caption, f"{path}: item {i} (image {image_id})")
        if image_id in predictions:
            first = next(j for j, earlier in enumerate(data) if earlier["image_id"] == image_id)
            raise DatasetError(f"{path}: image {image_id} has more than one caption (items {first} and {i}); "
                               "the COCO evaluation expects exactly one per image")
        predictions[image_id] = caption
    unknown = [image_id for image_id in predictions if image_id not in references]
    if unknown:
        shown = ", ".join(str(image_id) for image_id in unknown[:5])
        more = ", ..." if len(unknown) > 5 else ""
        raise DatasetError(f"{path}: {len(unknown)} of {len(predictions)} image ids are not in the annotations "
                           f"({shown}{more}); wrong annotation file or split?")
    return predictions


def scored_ids(references: Mapping[int, list[str]], predictions: Mapping[int, str]) -> list[int]:
    """The predicted image ids, sorted, after checking each has references."""
    if not predictions:
        raise DatasetError("no predictions to score")
    missing = [image_id for image_id in predictions if not references.get(image_id)]
    if missing:
        shown = ", ".join(str(image_id) for image_id in missing[:5])
        raise DatasetError(f"{len(missing)} predicted image ids have no reference captions ({shown})")
    # Sorted because pycocoevalcap's SPICE returns per-image scores in sorted id order while
    # COCOEvalCap pairs them with the ids in dict order; with sorted keys every scorer agrees.
    # No corpus score depends on the order.
    return sorted(predictions)


def write_results(path: str | os.PathLike[str], predictions: Mapping[int, str]) -> Path:
    """Write the COCO results format, `[{"image_id": int, "caption": str}, ...]`, sorted by image id."""
    path = Path(path)
    rows = [{"image_id": image_id, "caption": predictions[image_id]} for image_id in sorted(predictions)]
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(rows, indent=1)))  # a full disk keeps the old file
    return path


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
        "per_image": [{"image_id": image_id, **{k: _json_number(float(v)) for k, v in per_image[image_id].items()}}
                      for image_id in sorted(per_image)],
    }
    text = json.dumps(document, indent=1) + "\n"
    write_atomically(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))  # a full disk keeps the old file


# The user's own evaluations, which `evaluate --out` replaces and the tables read: COCO's 40,504 test images make a
# scores file of about 10 MB. (One beside someone else's model is held to bounded_files.SCORES_JSON_BYTES.)
SCORES_FILE_MAX_BYTES = 1 << 28


def is_scores_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a scores file as `write_scores_json` writes them: what `evaluate --out` may replace."""
    try:
        document = read_scores_json(path, DatasetError, SCORES_FILE_MAX_BYTES)
    except (OSError, CaptionerError):  # missing, unreadable, past its caps, not a JSON object
        return False
    return {"overall", "num_images", "per_image"} <= document.keys()


def read_scores_file(path: str | os.PathLike[str], remedy: str) -> dict[str, Any]:
    """A scores file's JSON object, for what tables it: a missing file is one DatasetError saying `remedy` (the
    command that writes one); a folder, a pipe, text that is not UTF-8 or not JSON, past its caps, or JSON that is
    not an object, one naming the file."""
    try:
        return read_scores_json(path, DatasetError, SCORES_FILE_MAX_BYTES)
    except FileNotFoundError:
        raise DatasetError(f"{path}: no scores file ({remedy})") from None


def score_fields(value: Any, where: str, keys: Collection[str]) -> dict[str, Any]:
    """`value`, an object of a scores file (its "overall", a grounding's baselines) that holds every one of `keys` as
    a number, or null where the score was not finite (`write_scores_json`); else one DatasetError naming `where`."""
    if not isinstance(value, dict):
        found = "nothing" if value is None else f"a JSON {type(value).__name__}"
        raise DatasetError(f"{where}: expected an object of scores, found {found}")
    for key in keys:
        if key not in value:
            raise DatasetError(f"{where}: no {key!r}")
        number = value[key]
        if number is not None and not is_number(number):
            raise DatasetError(f"{where}: {key} is {str(number)[:40]!r}, not a number")
    return value


def rounded(scores: Mapping[str, float]) -> dict[str, float]:
    """Scores to 4 decimals, as reports print and return them (the scores file keeps every digit)."""
    return {key: round(value, 4) for key, value in scores.items()}
