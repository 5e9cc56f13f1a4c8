"""Caption the first COUNT Flickr8k test photographs (by name) with the model packaged with captioner
and write what it said to tests/data/packaged_captions.json, which tests/test_packaged_captions.py
holds the installed model to. Run it again after packaging another model.

    python scripts/packaged_captions.py --photos data/flickr8k/images \\
        --split data/flickr8k/Flickr_8k.testImages.txt
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

EXPECTED = Path(__file__).resolve().parents[1] / "tests" / "data" / "packaged_captions.json"


def test_photos(photos: Path, split: Path, count: int) -> list[Path]:
    """The first `count` photographs of the split file (by name) that `photos` holds."""
    names = sorted(line.strip() for line in split.read_text().splitlines() if line.strip())
    return [photos / name for name in names if (photos / name).is_file()][:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True, help="a folder of Flickr8k photographs")
    parser.add_argument("--split", type=Path, required=True, help="Flickr_8k.testImages.txt")
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--out", type=Path, default=EXPECTED)
    args = parser.parse_args()

    from captioner.core.machine_cache import machine_key
    from captioner.models.checkpoint import default_model

    model = default_model("cpu")
    photos = test_photos(args.photos, args.split, args.count)
    captions = model.caption(photos)
    record = {
        "model": model.origin.name,
        "made_on": machine_key(),
        "decode": {"beam_size": model.decode_config.beam_size,
                   "length_penalty": model.decode_config.length_penalty},
        "captions": {photo.name: {"text": c.text, "score": c.score} for photo, c in zip(photos, captions)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for photo, caption in zip(photos, captions):
        print(f"{photo.name}\t{caption.score:.4f}\t{caption.text}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
