"""The training loader's CPU cost per image and its bytes to the device, before and after the
uint8 pipeline, side by side, for the data section of a COCO config (448 px, augmentation on).

    python benchmarks/bench_loader.py [--config configs/coco_lstm_resnet101.yaml] [--images 200]

Per image, on ONE core (torch and PIL single-threaded, in this process, as one DataLoader worker
runs it): `load_image` (JPEG decode, EXIF orientation, RGB), then the training transform;
images/s per core = 1 / (decode + transform), timed in CPU seconds of this thread
(time.thread_time), so other processes on a shared machine slow the wall clock, not the figure. Two sets of photos: real Flickr8k JPEGs
(../shared/data/flickr8k/images, mostly 500x375) and synthetic 640x480 JPEGs of COCO's file size,
written as benchmarks/bench_gpu.py writes them. The rows:

- before: the pipeline as it was, reproduced here: RandomResizedCrop(scale 0.85-1, ratio
  0.9-1.1), ColorJitter, ToDtype(float32) and Normalize in the worker; fp32 to the device;
- after: `ImageTransform` (crop window, ColorJitter) in the worker; uint8 to the device, where
  the encoder converts and normalises;
- after, crop only: the same without ColorJitter (the largest CPU cost of the transform);
- device_preprocess=transform: the worker decodes only (`load_image`, then uint8); the picture
  crosses at its own size and the device crops, resizes and jitters it;
- device_preprocess=decode: the worker reads the file and its header; the JPEG's bytes cross
  (the mean file size) and the device also decodes (not measurable without one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image
from torchvision.transforms import v2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_gpu import write_jpegs  # noqa: E402

from captioner.core.config import load_config  # noqa: E402
from captioner.data.images import (  # noqa: E402
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageTransform,
    RandomWindowCrop,
    load_image,
)

FLICKR8K = ROOT.parent / "shared" / "data" / "flickr8k" / "images"


def old_training_transform(size: int) -> v2.Compose:
    """The training transform before this change: fp32, normalised in the worker."""
    return v2.Compose([
        v2.PILToTensor(),
        v2.RandomResizedCrop(size, scale=(0.85, 1.0), ratio=(0.9, 1.1), antialias=True),
        v2.ColorJitter(brightness=0.2, contrast=0.2),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def per_image_costs(paths: list[Path], pipelines: dict[str, Callable[[Image.Image], torch.Tensor]], repeats: int) -> dict:
    """Per pass, each image is decoded once and every pipeline transforms it in turn (interleaved,
    so a busy moment of a shared machine falls on all of them alike). Median over `repeats`
    passes of the mean CPU seconds per image: the decode, each pipeline's transform; and the
    mean bytes of each pipeline's output."""
    decode_runs: list[float] = []
    transform_runs: dict[str, list[float]] = {label: [] for label in pipelines}
    total_bytes = dict.fromkeys(pipelines, 0)
    for _ in range(repeats):
        decode = 0.0
        work = dict.fromkeys(pipelines, 0.0)
        for path in paths:
            start = time.thread_time()
            image = load_image(path)
            decode += time.thread_time() - start
            for label, transform in pipelines.items():
                start = time.thread_time()
                tensor = transform(image)
                work[label] += time.thread_time() - start
                total_bytes[label] += tensor.nbytes
        decode_runs.append(decode / len(paths))
        for label in pipelines:
            transform_runs[label].append(work[label] / len(paths))
    return {
        "decode": statistics.median(decode_runs),
        "transform": {label: statistics.median(runs) for label, runs in transform_runs.items()},
        "bytes": {label: total / (repeats * len(paths)) for label, total in total_bytes.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "coco_lstm_resnet101.yaml"))
    parser.add_argument("--images", type=int, default=200, help="photos per set")
    parser.add_argument("--repeats", type=int, default=3, help="passes over each set (the median is reported)")
    parser.add_argument("--flickr8k", default=str(FLICKR8K), help="folder of real JPEG photos")
    args = parser.parse_args()

    torch.set_num_threads(1)  # one core, as a DataLoader worker runs (torch sets 1 thread there)
    data = load_config(args.config).data
    size = data.image_size
    pipelines = {
        "before (fp32, normalised in the worker)": old_training_transform(size),
        "after (uint8, normalised on the device)": ImageTransform(size, train=True, augment=data.augment),
        "after, crop only (no jitter)": v2.Compose([v2.PILToTensor(), RandomWindowCrop(size)]),
        "device_preprocess=transform (decode only)": v2.PILToTensor(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        sets = {"synthetic 640x480": write_jpegs(Path(tmp), args.images, (640, 480))}
        real = sorted(Path(args.flickr8k).glob("*.jpg"))[: args.images]
        if real:
            sets["Flickr8k photos"] = real
        else:
            print(f"{args.flickr8k}: no JPEG photos there; only the synthetic set is measured")
        print(f"{args.config}: image_size {size}, augment {data.augment}; one core (CPU time), {args.images} images a set, "
              f"median of {args.repeats} passes")
        print(f"{'photos':<20} {'pipeline':<42} {'decode ms':>9} {'transform ms':>12} {'images/s/core':>13} {'bytes/image to device':>22}")
        for name, paths in sets.items():
            jpeg_bytes = statistics.mean(p.stat().st_size for p in paths)
            sides = statistics.mean(Image.open(p).width for p in paths), statistics.mean(Image.open(p).height for p in paths)
            torch.manual_seed(0)
            costs = per_image_costs(paths, pipelines, args.repeats)
            for label in pipelines:
                transform = costs["transform"][label]
                rate = 1.0 / (costs["decode"] + transform)
                print(f"{name:<20} {label:<42} {costs['decode'] * 1e3:>9.2f} {transform * 1e3:>12.2f} "
                      f"{rate:>13.1f} {costs['bytes'][label]:>22,.0f}")
            print(f"{name:<20} {'device_preprocess=decode (JPEG bytes)':<42} {'on GPU':>9} {'on GPU':>12} {'-':>13} {jpeg_bytes:>22,.0f}"
                  f"   (mean {sides[0]:.0f}x{sides[1]:.0f})")


if __name__ == "__main__":
    main()
