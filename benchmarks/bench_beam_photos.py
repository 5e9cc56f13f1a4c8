"""Batched beam search over real photographs, as evaluation and the demo's batches run it. --images
Flickr8k photographs encoded once, searched in batches of --batch: a trained decoder ends its
searches at different steps, so this checks the CPU's shrinking batch."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from PIL import Image

from captioner.apps.arguments import decode_value, positive_int
from captioner.data.image_transform import picture_tensor
from captioner.core.config_sections import thread_count
from captioner.models.checkpoint import load_captioner
from captioner.models.decoding import DecodeOptions, beam_search

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.shared_data import SHARED_DATA  # noqa: E402
from benchmarks.timing import argument_parser, measure, print_environment, run_main  # noqa: E402

PHOTOS = SHARED_DATA / "flickr8k_224" / "images"


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("beam_photos", __doc__)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--images", type=positive_int, default=320)
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--beam", type=decode_value("beam_size"), default=3)
    parser.add_argument("--length-penalty", type=decode_value("length_penalty"), default=0.0)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--threads", type=thread_count, default=2)
    args = parser.parse_args(argv)
    files = sorted(PHOTOS.glob("*.jpg"))[-args.images :]
    if len(files) < args.images:
        raise SystemExit(f"{PHOTOS}: {len(files)} photographs, --images asks for {args.images}")
    torch.set_num_threads(args.threads)
    print_environment(args)
    model = load_captioner(args.checkpoint, device="cpu").eval()
    pixels = torch.stack([picture_tensor(Image.open(f).convert("RGB")) for f in files])  # (I, 3, H, W)
    with torch.no_grad():
        feats = torch.cat([model.encode(pixels[i : i + 64])[0] for i in range(0, len(files), 64)])  # (I, N, D)
    options = DecodeOptions(beam_size=args.beam, max_length=25, length_penalty=args.length_penalty)
    def search_all() -> None:
        for i in range(0, len(files), args.batch):
            beam_search(model.decoder, feats[i : i + args.batch], model.special_tokens, options)

    timing = measure(search_all, repeats=args.rounds, warmup=1)  # the warm-up: the allocator and the weight reorders
    print(f"{args.checkpoint}: {len(files)} photographs, batches of {args.batch}, beam {args.beam}: "
          f"{timing} = {len(files) / timing.median:.1f} images/s")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
