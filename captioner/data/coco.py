"""COCO-format caption files (COCO 2014/2017, the shapes world) and Karpathy split files."""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from pathlib import Path

from pycocotools.coco import COCO

from captioner.core.errors import DatasetError
from captioner.data.records import (ImageRecord, check_file, drop_missing, is_int, leading_out, leaves_folder,
                                    read_json)

log = logging.getLogger(__name__)

KARPATHY_COCO_SIZES = {"train": 113_287, "val": 5_000, "test": 5_000}  # train with restval (82,783 + 30,504)
KARPATHY_SPLITS = ("train", "restval", "val", "test")  # the values an entry's `split` may take
_reported: set[tuple[str, int]] = set()  # (file, mtime) whose sizes this process has logged, once


def load_coco_captions(annotation_file: str | Path, image_root: str | Path, check_images: bool = True,
                       strict: bool = False, max_missing: float = 1.0) -> list[ImageRecord]:
    """Records of a COCO caption file (`captions_*.json`) read through pycocotools."""
    annotation_file = check_file(annotation_file, "caption annotation file")
    coco = read_coco(annotation_file, "COCO caption file", ("images", "annotations"))
    image_root = Path(image_root)
    for k, image in enumerate(coco.dataset["images"]):
        if leaves_folder(image["file_name"]):
            raise leading_out(image["file_name"], f"{annotation_file}: images[{k}]: file_name", image_root)
    texts = {i: [ann["caption"].strip() for ann in coco.imgToAnns.get(i, [])] for i in sorted(coco.imgs)}
    blank = [i for i, image_texts in texts.items() for text in image_texts if not text]
    warn_blank(annotation_file, "caption", [f"image {i}" for i in blank])  # one of no words teaches silence
    captions = {i: tuple(text for text in image_texts if text) for i, image_texts in texts.items()}
    records = [ImageRecord(i, image_root / coco.imgs[i]["file_name"], texts) for i, texts in captions.items() if texts]
    if not records:
        raise DatasetError(f"{annotation_file}: no image has a caption")
    return drop_missing(records, str(annotation_file), strict, max_missing) if check_images else records


def read_coco(path: Path, what: str, lists: tuple[str, ...]) -> COCO:
    """A pycocotools index of a COCO-format file holding the `lists`, each entry checked first (one DatasetError)."""
    data = read_json(path, what)
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in lists):
        raise DatasetError(f"{path}: not a {what} (needs {' and '.join(repr(k) for k in lists)} lists)")
    instances = "categories" in lists
    images = _check_entries(path, data["images"], "images", {"id": is_int, **(_SIZE if instances else _FILE)})
    categories = (_check_entries(path, data["categories"], "categories", {"id": is_int, "name": _is_str})
                  if instances else set())
    fields = {"image_id": is_int, **({"category_id": is_int, "segmentation": _is_segmentation} if instances
                                     else {"caption": _is_str})}
    annotations = data["annotations"]
    _check_entries(path, annotations, "annotations", fields)
    for i, ann in enumerate(annotations):
        if ann["image_id"] not in images:
            raise DatasetError(f"{path}: annotations[{i}] names image_id {ann['image_id']}, "
                               "which 'images' does not list")
        if instances and ann["category_id"] not in categories:
            raise DatasetError(f"{path}: annotations[{i}] names category_id {ann['category_id']}, "
                               "which 'categories' does not list")
        ann.setdefault("id", -1 - i)  # pycocotools indexes annotations by id; captions may lack one
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        coco.createIndex()
    return coco


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_positive_int(value: object) -> bool:
    return is_int(value) and value > 0  # type: ignore[operator]


def _is_segmentation(value: object) -> bool:
    """Polygons (a list of coordinate lists) or run-length encoding (a dict with counts and size)."""
    if isinstance(value, list):
        return all(isinstance(p, list) and len(p) >= 6 and all(isinstance(v, (int, float)) for v in p) for p in value)
    return isinstance(value, dict) and "counts" in value and isinstance(value.get("size"), list)


_FILE = {"file_name": _is_str}
_SIZE = {"height": _is_positive_int, "width": _is_positive_int}
_KINDS = {is_int: "an integer", _is_str: "a string", _is_positive_int: "a positive integer",
          _is_segmentation: "polygons or RLE"}


def _check_entries(path: Path, entries: list, name: str, fields: dict) -> set:
    """Check that each entry is an object whose `fields` pass their checks; the set of ids, unique."""
    ids: dict[object, int] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DatasetError(f"{path}: {name}[{i}] is a {type(entry).__name__}, not an object")
        for field, valid in fields.items():
            if field not in entry:
                raise DatasetError(f"{path}: {name}[{i}] has no {field!r}")
            if not valid(entry[field]):
                shown = repr(entry[field])
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                raise DatasetError(f"{path}: {name}[{i}]: {field!r} must be {_KINDS[valid]}, got {shown}")
        if "id" in entry:
            if not is_int(entry["id"]):
                raise DatasetError(f"{path}: {name}[{i}]: 'id' must be an integer, got {entry['id']!r}")
            if entry["id"] in ids:
                raise DatasetError(f"{path}: {name}[{i}] repeats id {entry['id']} of {name}[{ids[entry['id']]}]")
            ids[entry["id"]] = i
    return set(ids)


def load_karpathy(split_file: str | Path, image_root: str | Path, split: str, check_images: bool = True,
                  strict: bool = False, max_missing: float = 1.0) -> list[ImageRecord]:
    """Records of one split of a Karpathy file (`dataset_coco.json`, ...), `restval` joining `train` as in the
    papers; Flickr entries have no `filepath` or `cocoid` (ids are `imgid`)."""
    split_file = Path(split_file)  # read_json names it when it is missing
    data = read_json(split_file, "Karpathy split file")
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list):
        raise DatasetError(f"{split_file}: not a Karpathy split file (no 'images' list)")
    wanted = {"train": ("train", "restval"), "val": ("val",), "test": ("test",)}[split]
    image_root = Path(image_root)
    records = []
    seen: dict[int, int] = {}
    sizes: Counter[str] = Counter()
    blank: list[str] = []  # the sentences with no words
    for i, entry in enumerate(images):
        where = f"{split_file}: images[{i}]"
        if not isinstance(entry, dict):
            raise DatasetError(f"{where} is a {type(entry).__name__}, not an object")
        for field in ("split", "filename", "sentences"):
            if field not in entry:
                raise DatasetError(f"{where} has no {field!r}")
        if not isinstance(entry["filename"], str) or not isinstance(entry.get("filepath", ""), str):
            raise DatasetError(f"{where}: 'filename' and 'filepath' must be strings")
        for field in ("filepath", "filename"):
            if leaves_folder(entry.get(field, "")):
                raise leading_out(entry[field], f"{where}: {field!r}", image_root)
        image_id = entry.get("cocoid", entry.get("imgid", i))
        if not is_int(image_id):
            raise DatasetError(f"{where}: 'cocoid'/'imgid' must be an integer, got {image_id!r}")
        if image_id in seen:
            raise DatasetError(f"{where} repeats image id {image_id} of images[{seen[image_id]}]")
        seen[image_id] = i
        if entry["split"] not in KARPATHY_SPLITS:
            raise DatasetError(f"{where}: unknown split {entry['split']!r} (one of {', '.join(KARPATHY_SPLITS)})")
        sizes[entry["split"]] += 1
        if entry["split"] not in wanted:
            continue
        if not isinstance(entry["sentences"], list) or not entry["sentences"]:
            raise DatasetError(f"{where}: 'sentences' must be a non-empty list")
        texts = [_sentence(s, f"{where}.sentences[{j}]") for j, s in enumerate(entry["sentences"])]
        blank += [f"images[{i}].sentences[{j}]" for j, text in enumerate(texts) if not text]
        captions = tuple(text for text in texts if text)  # a caption of no words would teach the model to say nothing
        if not captions:
            raise DatasetError(f"{where}: every sentence is blank (no 'raw' text and no 'tokens')")
        records.append(ImageRecord(image_id, image_root / entry.get("filepath", "") / entry["filename"], captions))
    report_split_sizes(split_file, sizes, coco=any("cocoid" in e for e in images if isinstance(e, dict)))
    warn_blank(split_file, "sentence", blank)
    if not records:
        raise DatasetError(f"{split_file}: no images in split {split!r}")
    return drop_missing(records, str(split_file), strict, max_missing) if check_images else records


def report_split_sizes(split_file: Path, sizes: Counter[str], coco: bool) -> None:
    """Log a Karpathy file's split sizes; warn where a COCO file's differ from 113,287 / 5,000 / 5,000."""
    key = (str(split_file.resolve()), split_file.stat().st_mtime_ns)
    if key in _reported:
        return
    _reported.add(key)
    train = sizes["train"] + sizes["restval"]
    counted = {"train": train, "val": sizes["val"], "test": sizes["test"]}
    log.info("%s: train %d (%d train + %d restval), val %d, test %d images",
             split_file, train, sizes["train"], sizes["restval"], sizes["val"], sizes["test"])
    if coco and counted != KARPATHY_COCO_SIZES:
        log.warning("%s: split sizes %s differ from Karpathy's COCO split (%s): a partial or modified file?",
                    split_file, " / ".join(f"{k} {v}" for k, v in counted.items()),
                    " / ".join(map(str, KARPATHY_COCO_SIZES.values())))


def warn_blank(path: Path, kind: str, where: list[str]) -> None:
    """One warning for the blank captions (`kind`: caption or sentence) skipped in `path`, naming the first."""
    if where:
        plural = len(where) > 1
        log.warning("%s: %d blank %s%s skipped (%s%s)", path, len(where), kind, "s" if plural else "", where[0],
                    ", ..." if plural else "")


def _sentence(sentence: object, where: str) -> str:
    """A Karpathy sentence's text: its `raw` string, else its `tokens` joined; empty when it has no words."""
    if isinstance(sentence, dict) and isinstance(sentence.get("raw"), str):
        return sentence["raw"].strip()
    if isinstance(sentence, dict) and "raw" not in sentence and isinstance(sentence.get("tokens"), list):
        if all(isinstance(t, str) for t in sentence["tokens"]):
            return " ".join(sentence["tokens"]).strip()
    raise DatasetError(f"{where}: needs a 'raw' string or a 'tokens' list of strings")


def coco_split_files(root: str | Path, year: int, split: str) -> tuple[Path, Path]:
    """(caption file, image folder) of an official COCO release: train{year}, or val{year} for val and test."""
    root = Path(root)
    source = "train" if split == "train" else "val"
    return root / "annotations" / f"captions_{source}{year}.json", root / f"{source}{year}"


def split_coco_val(records: list[ImageRecord], split: str) -> list[ImageRecord]:
    """The first half of val{year} by image id is `val`, the second half `test`."""
    if split == "train":
        return records
    half = len(records) // 2
    return records[:half] if split == "val" else records[half:]
