"""The training loader's CPU cost per image and its bytes to the device, before and after the
uint8 pipeline, side by side, for the data section of a COCO config (448 px, augmentation on).

    python scripts/bench_loader.py [--config configs/coco_lstm_resnet101.yaml] [--images 200]

Per image, on ONE core (torch and PIL single-threaded, in this process, as one DataLoader worker
runs it): `load_image` (JPEG decode, EXIF orientation, RGB), then the training transform;
images/s per core = 1 / (decode + transform), timed in CPU seconds of this thread
(time.thread_time), so other processes on a shared machine slow the wall clock, not the figure. Two sets of photos: real Flickr8k JPEGs
(../shared/data/flickr8k/images, mostly 500x375) and synthetic 640x480 JPEGs of COCO's file size,
written as scripts/bench_gpu.py writes them. The rows:

- before: the pipeline as it was, reproduced here: RandomResizedCrop(scale 0.85-1, ratio
  0.9-1.1), ColorJitter, ToDtype(float32) and Normalize in the worker; fp32 to the device;
- after: `ImageTransform` (crop window, ColorJitter) in the worker; uint8 to the device, where
  the encoder converts and normalises;
- after, crop only: the same without ColorJitter: what the cores would do if the jitter moved
  to the device too (it is the largest CPU cost of the transform);
- GPU decode: what crosses when the JPEG bytes themselves travel (the mean file size); the
  decode, crop and resize then cost the GPU, not the cores (not measurable without one).
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
sys.path.insert(0, str(ROOT / "scripts"))
from bench_gpu import write_jpegs  # noqa: E402

from captioner.config import load_config  # noqa: E402
from captioner.data.images import IMAGENET_MEAN, IMAGENET_STD, ImageTransform, RandomWindowCrop, load_image  # noqa: E402

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


def per_image_seconds(paths: list[Path], transform: Callable[[Image.Image], torch.Tensor], repeats: int) -> dict:
    """Median over `repeats` passes of the mean seconds per image for decode and for transform,
    and the bytes of one output tensor."""
    decode_runs, transform_runs = [], []
    nbytes = 0
    for _ in range(repeats):
        decode = work = 0.0
        for path in paths:
            start = time.thread_time()
            image = load_image(path)
            middle = time.thread_time()
            tensor = transform(image)
            decode += middle - start
            work += time.thread_time() - middle
            nbytes = tensor.nbytes
        decode_runs.append(decode / len(paths))
        transform_runs.append(work / len(paths))
    return {"decode": statistics.median(decode_runs), "transform": statistics.median(transform_runs), "bytes": nbytes}


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
        "after, crop only (jitter on the device)": v2.Compose([v2.PILToTensor(), RandomWindowCrop(size)]),
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
            for label, transform in pipelines.items():
                torch.manual_seed(0)
                result = per_image_seconds(paths, transform, args.repeats)
                rate = 1.0 / (result["decode"] + result["transform"])
                print(f"{name:<20} {label:<42} {result['decode'] * 1e3:>9.2f} {result['transform'] * 1e3:>12.2f} "
                      f"{rate:>13.1f} {result['bytes']:>22,}")
            print(f"{name:<20} {'GPU decode (JPEG bytes cross)':<42} {'on GPU':>9} {'on GPU':>12} {'-':>13} {jpeg_bytes:>22,.0f}"
                  f"   (mean {sides[0]:.0f}x{sides[1]:.0f})")


if __name__ == "__main__":
    main()
