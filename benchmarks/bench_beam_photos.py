"""Batched beam search over real photographs, as evaluation and the demo's batches run it.

    python benchmarks/bench_beam_photos.py runs/flickr8k_full/lstm/best.pt [--images 320] [--batch 32] [--threads 2]
    python benchmarks/bench_beam_photos.py CHECKPOINT --root /tmp/old   # an older checkout's decoding, same photographs

Encodes --images Flickr8k photographs (the 224x224 folder of the shared data, test-split end of the
sorted list) once, then times beam search (beam 3, the checkpoint's decoder, `--length-penalty`)
over them in batches of --batch, --rounds times after one warm-up round, and prints the median.
The captions' lengths decide how long each batch runs, so random grids would not do: a trained
decoder on real photographs ends its searches at different steps, as it does in use.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from bench_scst import use_checkout
from PIL import Image
from shared_data import SHARED_DATA

PHOTOS = SHARED_DATA / "flickr8k_224" / "images"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout whose captioner runs")
    parser.add_argument("--images", type=int, default=320)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--length-penalty", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    use_checkout(args.root)
    from captioner.models.checkpoint import load_captioner
    from captioner.models.decoding import DecodeOptions, beam_search

    files = sorted(PHOTOS.glob("*.jpg"))[-args.images :]
    if len(files) < args.images:
        raise SystemExit(f"error: {PHOTOS}: {len(files)} photographs, --images asks for {args.images}")
    torch.set_num_threads(args.threads)
    model = load_captioner(args.checkpoint, device="cpu").eval()
    pixels = torch.stack([torch.from_numpy(np.array(Image.open(f).convert("RGB"))).permute(2, 0, 1) for f in files])  # (I, 3, H, W)
    with torch.no_grad():
        feats = torch.cat([model.encode(pixels[i : i + 64])[0] for i in range(0, len(files), 64)])  # (I, N, D)
    options = DecodeOptions(beam_size=args.beam, max_length=25, length_penalty=args.length_penalty)
    times = []
    for _ in range(args.rounds + 1):  # the first round warms the allocator and the weight reorders
        start = time.perf_counter()
        for i in range(0, len(files), args.batch):
            beam_search(model.decoder, feats[i : i + args.batch], model.special_tokens, options)
        times.append(time.perf_counter() - start)
    median = statistics.median(times[1:])
    print(f"{args.root.name} {args.checkpoint}: {len(files)} photographs, batches of {args.batch}, beam {args.beam}, "
          f"{args.threads} threads: {median:.2f} s (rounds {', '.join(f'{t:.2f}' for t in times[1:])}) = {len(files) / median:.1f} images/s")


if __name__ == "__main__":
    main()
