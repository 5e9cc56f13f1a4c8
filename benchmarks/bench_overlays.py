"""A caption's word pictures, as the demo draws them: the maps brought to the photo's size, the
overlays, their JPEG files; and the upsampling against F.interpolate's, side by side.

One process, the same maps: `upsample` (two small products) and the former F.interpolate call
take turns, one call each (bench_products.alternating), then `word_overlays` and the JPEG files
the demo writes of them. Prints the median milliseconds of each over the rounds.

    python benchmarks/bench_overlays.py [--photo FILE] [--words 10] [--grid 7] [--rounds 30] [--threads N]

The photo defaults to a 500x375 Flickr8k one, shown as the demo shows it (at most 512 px a side).
Name the processor (`lscpu`) and what else was running beside what it prints.
"""

from __future__ import annotations

import argparse
import io

import torch
import torch.nn.functional as F
from bench_products import alternating, median_ms
from shared_data import SHARED_DATA

from captioner.apps.demo.page import DISPLAY_SIDE
from captioner.apps.demo.ui import JPEG_QUALITY
from captioner.core.runtime import set_threads
from captioner.data.pictures import load_image
from captioner.models.caption import Caption, upsample
from captioner.viz.overlays import word_overlays

PHOTO = SHARED_DATA / "flickr8k" / "images" / "1001773457_577c3a7d70.jpg"  # 500x375


def interpolated(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The former `upsample`: F.interpolate's bilinear kernel, then the same clamp and sums."""
    maps = F.interpolate(maps[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0]  # (T, H, W)
    maps = maps.clamp_min(0)
    return maps / maps.sum(dim=(1, 2), keepdim=True).clamp_min(1e-12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photo", default=str(PHOTO))
    parser.add_argument("--words", type=int, default=10, help="words of the caption: one map each")
    parser.add_argument("--grid", type=int, default=7, help="the attention grid's side (7 for Lite0 at 224 px)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: captioner.core.runtime's)")
    args = parser.parse_args()
    if args.words < 1 or args.grid < 1 or args.rounds < 1:
        parser.error("--words, --grid and --rounds must be positive")
    threads = set_threads(args.threads)
    image = load_image(args.photo)
    image.thumbnail((DISPLAY_SIDE, DISPLAY_SIDE))
    torch.manual_seed(0)
    attn = torch.softmax(torch.randn(args.words, 1, 1, args.grid * args.grid), dim=-1).view(args.words, 1, 1, args.grid, args.grid)  # (T, L, H, h, w)
    caption = Caption("", [f"w{i}" for i in range(args.words)], list(range(args.words)), 0.0, 0.0, attn, True)
    maps, size = caption.heatmaps(), (image.height, image.width)
    torch.testing.assert_close(upsample(maps, size), interpolated(maps, size), rtol=1e-5, atol=1e-9)

    def jpeg_files() -> None:
        for _, picture in word_overlays(image, caption):
            picture.save(io.BytesIO(), format="JPEG", quality=JPEG_QUALITY)

    former, products = alternating(lambda: interpolated(maps, size), lambda: upsample(maps, size), args.rounds)  # a busy moment costs both alike
    timings = {
        "upsample, F.interpolate (the former)": former,
        "upsample, two products": products,
        "word overlays (upsample included)": median_ms(lambda: word_overlays(image, caption), args.rounds),
        "word overlays and their JPEG files": median_ms(jpeg_files, args.rounds),
    }
    print(f"{args.words} maps of {args.grid}x{args.grid} over a {image.width}x{image.height} photo, {threads} threads, "
          f"median ms of {args.rounds} calls (the upsamplings alternating call by call)")
    for name, value in timings.items():
        print(f"  {name:42s} {value:8.2f} ms")


if __name__ == "__main__":
    main()
