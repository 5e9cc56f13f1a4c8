"""Package a run's model inside captioner: the model `pip install` installs and every command uses
when no model is named (captioner/pretrained/<name>/; the logic is captioner/apps/packaged_model.py).
Run it from the project folder after `captioner evaluate RUN --split test`, so the card has the scores."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from captioner.apps.arguments import AnyOrderParser, decode_value, expand_images, takes
from captioner.apps.cli import refused
from captioner.apps.packaged_model import package_model
from captioner.core.errors import CaptionerError


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", metavar="RUN_FOLDER", help="a run folder (its best.pt) or a checkpoint")
    parser.add_argument("--name", help="the packaged model's name and folder (default: the run folder's name)")
    parser.add_argument("--into", type=Path, default=None, help="write NAME/ here instead of captioner/pretrained/")
    parser.add_argument("--images", nargs="+", default=None, metavar="IMAGE",
                        help="images (or folders) whose captions decide float16 storage and check the result "
                             "(default: the first 8 test images of the run's dataset)")
    parser.add_argument("--beam", type=decode_value("beam_size"), default=None,
                        help=f"the default beam width, {takes('beam_size')}")
    parser.add_argument("--length-penalty", type=decode_value("length_penalty"), default=None, metavar="ALPHA",
                        help="the default length penalty, e.g. the one tuned on dev (default: the run's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    decode = {key: value for key, value in (("beam_size", args.beam), ("length_penalty", args.length_penalty))
              if value is not None}
    try:
        images = expand_images(args.images) if args.images is not None else None
        packaged = package_model(args.run, args.name, args.into, images, decode)
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2
    print(f"{packaged.folder}\t{packaged.bytes} bytes\t{'float16' if packaged.half_precision else 'float32'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
