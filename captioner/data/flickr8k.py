"""Flickr8k in its official text format: `Flickr8k.token.txt` and `Flickr_8k.{train,dev,test}Images.txt`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from captioner.core.errors import DatasetError
from captioner.data.records import ImageRecord, drop_missing, leading_out, leaves_folder, read_text

SPLIT_FILES = {"train": "Flickr_8k.trainImages.txt", "val": "Flickr_8k.devImages.txt",
               "test": "Flickr_8k.testImages.txt"}
TOKEN_FILE = "Flickr8k.token.txt"
# The photos' folder under the root: ours, else the one Flickr8k_Dataset.zip unpacks (misspelt there).
IMAGE_FOLDERS = ("images", "Flicker8k_Dataset")


def default_image_folder(root: str | Path) -> Path:
    """root/images, else root/Flicker8k_Dataset if only that exists (root/images if neither does)."""
    root = Path(root)
    return next((root / name for name in IMAGE_FOLDERS if (root / name).is_dir()), root / IMAGE_FOLDERS[0])


def read_token_file(path: str | Path) -> dict[str, list[str]]:
    """`<image>.jpg#<n>\\t<caption>` lines -> image name -> captions, in file order."""
    captions: dict[str, list[str]] = defaultdict(list)
    keys: dict[str, int] = {}
    for number, line in enumerate(read_text(path, "Flickr8k caption file").splitlines(), 1):
        if not line.strip():
            continue
        key, tab, caption = line.partition("\t")
        name, hash_, _ = key.partition("#")
        if not tab or not hash_ or not name:
            raise DatasetError(f"{path}:{number}: expected '<image>.jpg#<n><TAB><caption>', got {line[:60]!r}")
        if leaves_folder(name):
            raise leading_out(name, f"{path}:{number}: image")
        if not caption.strip():
            raise DatasetError(f"{path}:{number}: {key} has an empty caption")
        if key in keys:
            raise DatasetError(f"{path}:{number}: {key} repeats line {keys[key]}")
        keys[key] = number
        captions[name].append(caption.strip())
    if not captions:
        raise DatasetError(f"{path}: no captions")
    return dict(captions)


def load_flickr8k(root: str | Path, split: str, image_root: str | Path | None = None, check_images: bool = True,
                  strict: bool = False, max_missing: float = 1.0) -> list[ImageRecord]:
    """Records of one official split (val = dev); ids are positions in the caption file, stable across splits."""
    root = Path(root)
    captions = read_token_file(root / TOKEN_FILE)
    ids = {name: i for i, name in enumerate(captions)}
    split_file = root / SPLIT_FILES[split]
    lines: dict[str, int] = {}  # image name -> its line, in file order
    for number, line in enumerate(read_text(split_file, "Flickr8k split file").splitlines(), 1):
        name = line.strip()
        if not name:
            continue
        if name in lines:
            raise DatasetError(f"{split_file}:{number}: {name} repeats line {lines[name]}")
        if name not in captions:
            raise DatasetError(f"{split_file}:{number}: {name} has no captions in Flickr8k.token.txt")
        lines[name] = number
    folder = Path(image_root) if image_root is not None else default_image_folder(root)
    records = [ImageRecord(ids[n], folder / n, tuple(captions[n])) for n in lines]
    return drop_missing(records, str(split_file), strict, max_missing) if check_images else records
