"""COCO-format caption files (COCO 2014/2017, the shapes world) and Karpathy split files."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from pycocotools.coco import COCO

from captioner.data.records import ImageRecord, check_file, drop_missing
from captioner.errors import DatasetError


def load_coco_captions(
    annotation_file: str | Path, image_root: str | Path, check_images: bool = True, strict: bool = False
) -> list[ImageRecord]:
    """Records of a COCO caption file (`captions_*.json`) read through pycocotools."""
    annotation_file = check_file(annotation_file, "caption annotation file")
    coco = read_coco(annotation_file, "COCO caption file", ("images", "annotations"))
    image_root = Path(image_root)
    records = []
    for image_id in sorted(coco.imgs):
        info = coco.imgs[image_id]
        if "file_name" not in info:
            raise DatasetError(f"{annotation_file}: image {image_id} has no 'file_name'")
        captions = []
        for ann in coco.imgToAnns.get(image_id, []):
            if not isinstance(ann.get("caption"), str):
                raise DatasetError(f"{annotation_file}: annotation {ann.get('id')} has no 'caption' string")
            captions.append(ann["caption"].strip())
        if captions:
            records.append(ImageRecord(int(image_id), image_root / info["file_name"], tuple(captions)))
    if not records:
        raise DatasetError(f"{annotation_file}: no image has a caption")
    return drop_missing(records, str(annotation_file), strict) if check_images else records


def read_coco(path: Path, what: str, lists: tuple[str, ...]) -> COCO:
    """A pycocotools index of a COCO-format file whose top level holds the `lists` named; any
    malformation is one DatasetError naming the file."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in lists):
        raise DatasetError(f"{path}: not a {what} (needs {' and '.join(repr(k) for k in lists)} lists)")
    coco = COCO()
    coco.dataset = data
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
            coco.createIndex()
    except (KeyError, TypeError) as e:
        raise DatasetError(f"{path}: not a {what} (an entry lacks {e})") from None
    return coco


def load_karpathy(
    split_file: str | Path, image_root: str | Path, split: str, check_images: bool = True, strict: bool = False
) -> list[ImageRecord]:
    """Records of one split of a Karpathy file (`dataset_coco.json`, `dataset_flickr8k.json`, ...).

    As in the papers that use these splits, `restval` images join `train`. COCO entries carry
    `filepath` (train2014/val2014) and `cocoid`; Flickr entries carry neither, so their ids are
    `imgid`.
    """
    split_file = check_file(split_file, "Karpathy split file")
    try:
        data = json.loads(split_file.read_text())
        images = data["images"]
    except json.JSONDecodeError as e:
        raise DatasetError(f"{split_file}: not valid JSON ({e})") from None
    except (KeyError, TypeError):
        raise DatasetError(f"{split_file}: not a Karpathy split file (no 'images' list)") from None
    wanted = {"train": ("train", "restval"), "val": ("val",), "test": ("test",)}.get(split)
    if wanted is None:
        raise DatasetError(f"{split_file}: unknown split {split!r} (train, val or test)")
    image_root = Path(image_root)
    records = []
    for i, entry in enumerate(images):
        try:
            if entry["split"] not in wanted:
                continue
            path = image_root / entry.get("filepath", "") / entry["filename"]
            captions = tuple(s["raw"].strip() if "raw" in s else " ".join(s["tokens"]) for s in entry["sentences"])
            image_id = int(entry.get("cocoid", entry.get("imgid", i)))
        except (KeyError, TypeError) as e:
            raise DatasetError(f"{split_file}: image entry {i} lacks field {e}") from None
        records.append(ImageRecord(image_id, path, captions))
    if not records:
        raise DatasetError(f"{split_file}: no images in split {split!r}")
    return drop_missing(records, str(split_file), strict) if check_images else records


def coco_split_files(root: str | Path, year: int, split: str) -> tuple[Path, Path]:
    """(caption file, image folder) of an official COCO release unpacked under `root`.

    Without Karpathy's splits, train is train{year}; val and test are the two halves of
    val{year} (see `split_coco_val`).
    """
    root = Path(root)
    source = "train" if split == "train" else "val"
    return root / "annotations" / f"captions_{source}{year}.json", root / f"{source}{year}"


def split_coco_val(records: list[ImageRecord], split: str) -> list[ImageRecord]:
    """The first half of val{year} by image id is `val`, the second half `test`."""
    if split == "train":
        return records
    half = len(records) // 2
    return records[:half] if split == "val" else records[half:]
