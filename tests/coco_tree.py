"""A miniature COCO 2014 tree, in exactly the layout a COCO user has, built from real photographs.

    <root>/train2014/COCO_train2014_%012d.jpg
    <root>/val2014/COCO_val2014_%012d.jpg
    <root>/annotations/captions_train2014.json, captions_val2014.json   (COCO format)
    <root>/dataset_coco.json                                             (Karpathy's splits)

The photographs and their five captions are Flickr8k's train and dev images from the shared data
folder (never its test images), re-encoded at a smaller size so that the rehearsal decodes them
quickly. As in Karpathy's file, `train` images come from train2014 and `restval`, `val` and
`test` from val2014; each caption file lists every image of its folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from captioner.data.flickr8k import SPLIT_FILES, read_token_file

FIRST_ID = 100_000  # cocoids: one integer per image, unique across train2014 and val2014
LONG_SIDE = 160  # px: the copies keep their aspect ratio (4:3, 3:4, 3:2 ...)


@dataclass(frozen=True)
class CocoTree:
    root: Path
    karpathy_file: Path
    splits: dict[str, int]  # Karpathy split -> images

    @property
    def test_images(self) -> list[Path]:
        entries = json.loads(self.karpathy_file.read_text())["images"]
        return [self.root / e["filepath"] / e["filename"] for e in entries if e["split"] == "test"]


def build_coco_tree(flickr8k: Path, root: Path, train: int = 16, restval: int = 4, val: int = 6,
                    test: int = 6) -> CocoTree:
    """Write the tree under `root` from the first Flickr8k train/dev photographs in `flickr8k/images`."""
    allowed = {name for split in ("train", "val") for name in (flickr8k / SPLIT_FILES[split]).read_text().split()}
    captions = read_token_file(flickr8k / "Flickr8k.token.txt")
    names = [p.name for p in sorted((flickr8k / "images").iterdir()) if p.name in allowed and p.name in captions]
    counts = {"train": train, "restval": restval, "val": val, "test": test}
    if len(names) < sum(counts.values()):
        raise ValueError(f"{flickr8k}: {len(names)} train/dev photographs, {sum(counts.values())} asked for")
    entries, folders = [], {"train2014": [], "val2014": []}
    position = 0
    for split, count in counts.items():
        folder = "train2014" if split == "train" else "val2014"
        for name in names[position : position + count]:
            cocoid = FIRST_ID + position
            filename = f"COCO_{folder}_{cocoid:012d}.jpg"
            size = copy_photo(flickr8k / "images" / name, root / folder / filename)
            sentences = [{"raw": c, "tokens": re.findall(r"[a-z0-9]+", c.lower())} for c in captions[name]]
            entries.append({"filepath": folder, "filename": filename, "cocoid": cocoid, "imgid": position,
                            "split": split, "sentences": sentences})
            folders[folder].append((cocoid, filename, size, captions[name]))
            position += 1
    for index, sentence in enumerate(s for e in entries for s in e["sentences"]):
        sentence["sentid"] = index
    karpathy_file = root / "dataset_coco.json"
    karpathy_file.write_text(json.dumps({"dataset": "coco", "images": entries}))
    (root / "annotations").mkdir()
    for folder, images in folders.items():
        write_caption_file(root / "annotations" / f"captions_{folder}.json", images)
    return CocoTree(root, karpathy_file, counts)


def copy_photo(source: Path, target: Path) -> tuple[int, int]:
    """Re-encode a photograph as a JPEG whose longer side is LONG_SIDE; returns (width, height)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with Image.open(source) as image:
        image = image.convert("RGB")
        image.thumbnail((LONG_SIDE, LONG_SIDE))
        image.save(target, quality=90)
        return image.size


def write_caption_file(path: Path, images: list[tuple[int, str, tuple[int, int], list[str]]]) -> None:
    """A COCO-format caption file (`info`, `licenses`, `images`, `annotations`) for `images`."""
    annotations = [{"image_id": cocoid, "id": 0, "caption": c} for cocoid, _, _, caps in images for c in caps]
    for number, annotation in enumerate(annotations, 1):
        annotation["id"] = number
    path.write_text(json.dumps({
        "info": {"description": "a miniature COCO 2014 for the rehearsal"},
        "licenses": [],
        "images": [{"id": cocoid, "file_name": filename, "width": w, "height": h} for cocoid, filename, (w, h),
                   _ in images],
        "annotations": annotations,
    }))
