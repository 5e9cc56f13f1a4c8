"""Flickr8k in its official text format: `Flickr8k.token.txt` and `Flickr_8k.{train,dev,test}Images.txt`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from captioner.data.records import ImageRecord, check_file, drop_missing
from captioner.errors import DatasetError

SPLIT_FILES = {"train": "Flickr_8k.trainImages.txt", "val": "Flickr_8k.devImages.txt", "test": "Flickr_8k.testImages.txt"}


def read_token_file(path: str | Path) -> dict[str, list[str]]:
    """`<image>.jpg#<n>\\t<caption>` lines -> image name -> captions, in file order."""
    path = check_file(path, "Flickr8k caption file")
    captions: dict[str, list[str]] = defaultdict(list)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        key, tab, caption = line.partition("\t")
        name, hash_, _ = key.partition("#")
        if not tab or not hash_ or not name:
            raise DatasetError(f"{path}:{number}: expected '<image>.jpg#<n><TAB><caption>', got {line[:60]!r}")
        captions[name].append(caption.strip())
    if not captions:
        raise DatasetError(f"{path}: no captions")
    return dict(captions)


def load_flickr8k(
    root: str | Path,
    split: str,
    image_root: str | Path | None = None,
    check_images: bool = True,
    strict: bool = False,
) -> list[ImageRecord]:
    """Records of one official split (train, val = dev, test); `image_root` defaults to root/images.

    Image ids are the images' positions in the caption file, so they are stable across splits.
    """
    root = Path(root)
    if split not in SPLIT_FILES:
        raise DatasetError(f"{root}: unknown Flickr8k split {split!r} (train, val or test)")
    captions = read_token_file(root / "Flickr8k.token.txt")
    ids = {name: i for i, name in enumerate(captions)}
    split_file = check_file(root / SPLIT_FILES[split], "Flickr8k split file")
    names = [line.strip() for line in split_file.read_text().splitlines() if line.strip()]
    unknown = [n for n in names if n not in captions]
    if unknown:
        raise DatasetError(f"{split_file}: {len(unknown)} images have no captions in Flickr8k.token.txt (e.g. {unknown[0]})")
    folder = Path(image_root) if image_root is not None else root / "images"
    records = [ImageRecord(ids[n], folder / n, tuple(captions[n])) for n in names]
    return drop_missing(records, str(split_file), strict) if check_images else records
