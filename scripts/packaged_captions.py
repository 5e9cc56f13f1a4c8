"""Caption the first COUNT Flickr8k test photographs (by name) with the model packaged with captioner
and write what it said to tests/data/packaged_captions.json, which tests/test_packaged_captions.py
holds the installed model to. Run it again after packaging another model.

    python scripts/packaged_captions.py --photos data/flickr8k/images \\
        --split data/flickr8k/Flickr_8k.testImages.txt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from captioner.apps.arguments import AnyOrderParser, positive_int
from captioner.apps.cli import refused
from captioner.core.errors import CaptionerError
from captioner.core.files import check_writable_file, write_atomically
from captioner.data.records import read_text

EXPECTED = Path(__file__).resolve().parents[1] / "tests" / "data" / "packaged_captions.json"


def test_photos(photos: Path, split: Path, count: int) -> list[Path]:
    """The first `count` photographs of the split file (by name) that `photos` holds; none is one line."""
    names = sorted(line.strip() for line in read_text(split, "split file").splitlines() if line.strip())
    if not photos.is_dir():
        raise CaptionerError(f"--photos {photos}: not a folder of photographs")
    found = [photos / name for name in names if (photos / name).is_file()][:count]
    if not found:
        raise CaptionerError(f"--photos {photos}: holds none of the {len(names)} photographs that {split} names")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True, help="a folder of Flickr8k photographs")
    parser.add_argument("--split", type=Path, required=True, help="Flickr_8k.testImages.txt")
    parser.add_argument("--count", type=positive_int, default=12)
    parser.add_argument("--out", type=Path, default=EXPECTED)
    args = parser.parse_args(argv)
    try:
        check_writable_file(args.out)  # before the model is loaded: the record it holds stays until replaced whole
        photos = test_photos(args.photos, args.split, args.count)
        record, captions = caption_record(photos)
        text = json.dumps(record, indent=1) + "\n"
        write_atomically(args.out, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2
    for photo, caption in zip(photos, captions):
        print(f"{photo.name}\t{caption.score:.4f}\t{caption.text}")
    print(f"wrote {args.out}")
    return 0


def caption_record(photos: list[Path]) -> tuple[dict, list]:
    """What the packaged model says of `photos`, as the record holds it, and its captions."""
    from captioner.core.machine_cache import machine_key
    from captioner.models.checkpoint import default_model

    model = default_model("cpu")
    captions = model.caption(photos)
    record = {
        "model": model.origin.name,
        "made_on": machine_key(),
        "decode": {"beam_size": model.decode_config.beam_size,
                   "length_penalty": model.decode_config.length_penalty},
        "captions": {photo.name: {"text": c.text, "score": c.score} for photo, c in zip(photos, captions)},
    }
    return record, captions


if __name__ == "__main__":
    sys.exit(main())
