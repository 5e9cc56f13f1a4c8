"""The ONNX runtime against PyTorch on this CPU: caption agreement, score differences, latency per
image from file to caption, and (--install-size) the installed size of each path. Each --run exports
a checkpoint and captions the images with both at the same thread count (on a shared CPU set
OMP_WAIT_POLICY=PASSIVE)."""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from captioner.apps.arguments import decode_value, folder_to_write, positive_int
from captioner.core.errors import CaptionerError
from captioner.core.files import make_folder
from captioner.data.flickr8k import load_flickr8k
from captioner.core.config_sections import thread_count
from captioner.deploy.runtime import OnnxCaptioner
from captioner.models.captioner import Captioner
from captioner.models.onnx_export import export_onnx

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import argument_parser, measure, print_environment, run_main  # noqa: E402

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}
ONNX_PATH = ("onnxruntime", "numpy", "pillow", "pyyaml")
TORCH_PATH = ("torch", "torchvision", "numpy", "pillow", "pyyaml")


def image_paths(source: Path) -> list[Path]:
    """A Flickr8k root -> its official test photos on disk; a folder -> its images, sorted; anything else (a file, a
    folder without images) is one line."""
    if not source.is_dir():
        raise CaptionerError(f"--run IMAGES {source}: not a folder of images or a Flickr8k root")
    if (source / "Flickr_8k.testImages.txt").is_file():
        return [record.path for record in load_flickr8k(source, "test")]
    paths = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise CaptionerError(f"--run IMAGES {source}: no {', '.join(sorted(IMAGE_SUFFIXES))} images in it")
    return paths


def check_runs(runs: list[list[str]]) -> None:
    """Each --run's label a plain name (its export's folder), its checkpoint a model and its images there, said in
    one line before the first run's work."""
    from captioner.models.checkpoint import checkpoint_config

    for label, checkpoint, source in runs:
        if label in ("", ".", "..") or "/" in label or "\\" in label:
            raise CaptionerError(f"--run LABEL {label!r}: names the export's folder; give a plain name")
        checkpoint_config(checkpoint)
        image_paths(Path(source))


def per_image_ms(caption: Callable[[list[Path]], object], paths: list[Path], batch: int,
                 repeats: int) -> float:
    """Milliseconds per image to caption `paths` in batches of `batch`, the median of `repeats` passes
    after a warm-up pass (first-call allocations, thread pools)."""
    def caption_all() -> None:
        for i in range(0, len(paths), batch):
            caption(paths[i : i + batch])

    return 1000 * measure(caption_all, repeats, warmup=1).median / len(paths)


def compare(label: str, checkpoint: Path, source: Path, args: argparse.Namespace, out: Path) -> None:
    paths = image_paths(source)
    model = Captioner.from_pretrained(checkpoint, device="cpu")
    start = time.perf_counter()
    export_onnx(model, out / label)
    export_s = time.perf_counter() - start
    runtime = OnnxCaptioner.from_folder(out / label, threads=args.threads)
    decode = {"beam_size": args.beam}
    print(f"\n{label}: {checkpoint} ({model.config.encoder.name} + {model.config.decoder.type}), "
          f"{len(paths)} images from {source}; exported and checked in {export_s:.1f} s; beam {args.beam}, "
          f"max_length {model.decode_config.max_length}, length_penalty {model.decode_config.length_penalty}")

    expected = model.caption(paths, **decode)
    got = runtime.caption(paths, **decode)
    same = [(a, b) for a, b in zip(expected, got) if a.tokens == b.tokens]
    logprob_diff = max((abs(a.logprob - b.logprob) for a, b in same), default=float("nan"))
    score_diff = max((abs(a.score - b.score) for a, b in same), default=float("nan"))
    attn_diff = max((float(np.abs(a.attn.numpy() - b.attn).max(initial=0.0)) for a, b in same),
                    default=float("nan"))
    print(f"  agreement {len(same)}/{len(paths)} = {100 * len(same) / len(paths):.1f}%   "
          f"max |logprob diff| {logprob_diff:.2e}   "
          f"max |score diff| {score_diff:.2e}   max |attn diff| {attn_diff:.2e}")
    for a, b in [(a, b) for a, b in zip(expected, got) if a.tokens != b.tokens][:3]:
        print(f"    differs: torch {a.text!r} ({a.score:.4f})  onnx {b.text!r} ({b.score:.4f})")

    timed = paths[: args.latency_images]
    print(f"  latency per image (ms, file -> caption, {args.threads} thread{'s' if args.threads > 1 else ''}, "
          f"best of {args.repeats} over {len(timed)} images):")
    print(f"    {'batch':>5}  {'pytorch':>9}  {'onnx':>9}  {'speed-up':>8}")
    for batch in (1, 8):
        torch_ms = per_image_ms(lambda chunk: model.caption(chunk, **decode), timed, batch, args.repeats)
        onnx_ms = per_image_ms(lambda chunk: runtime.caption(chunk, **decode), timed, batch, args.repeats)
        print(f"    {batch:>5}  {torch_ms:>9.1f}  {onnx_ms:>9.1f}  {torch_ms / onnx_ms:>7.2f}x")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: Sequence[str]) -> set[str]:
    """The installed distributions `roots` need, with every dependency (extras left out)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = canonical(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency not installed here
        seen.add(name)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def installed_bytes(name: str) -> int:
    dist = metadata.distribution(name)
    total = 0
    for file in dist.files or []:
        path = Path(dist.locate_file(file))
        if path.is_file():
            total += path.stat().st_size
    return total


def print_install_sizes() -> None:
    print("\ninstall size (installed files of each path's distributions and all their dependencies, "
          "this environment):")
    for label, roots in (("onnx runtime path", ONNX_PATH), ("pytorch path", TORCH_PATH)):
        names = sorted(closure(roots))
        sizes = {name: installed_bytes(name) for name in names}
        largest = ", ".join(f"{n} {s / 2**20:.0f}" for n, s in sorted(sizes.items(), key=lambda x: -x[1])[:4])
        print(f"  {label:18} {sum(sizes.values()) / 2**20:8.0f} MiB in {len(names)} distributions "
              f"(largest, MiB: {largest})")
    package = Path(__file__).resolve().parent.parent / "captioner"
    size = sum(p.stat().st_size for p in package.rglob("*.py"))
    print(f"  captioner itself   {size / 2**20:8.1f} MiB of Python source (pip install --no-deps)")


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("onnx", __doc__)
    parser.add_argument("--run", nargs=3, action="append", default=[], metavar=("LABEL", "CHECKPOINT", "IMAGES"),
                        help="a checkpoint and a folder of images or a Flickr8k root (its test split); "
                             "repeatable")
    parser.add_argument("--beam", type=decode_value("beam_size"), default=3)
    parser.add_argument("--threads", type=thread_count, default=torch.get_num_threads(),
                        help="for both torch and onnxruntime")
    parser.add_argument("--latency-images", type=positive_int, default=16)
    parser.add_argument("--repeats", type=positive_int, default=2)
    parser.add_argument("--out", type=folder_to_write, default=None,
                        help="where the exports go (default: a temporary folder)")
    parser.add_argument("--install-size", action="store_true")
    args = parser.parse_args(argv)
    check_runs(args.run)
    if args.out is not None:
        make_folder(args.out, f"--out {args.out}")
    torch.set_num_threads(args.threads)
    print_environment(args)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        for label, checkpoint, source in args.run:
            compare(label, Path(checkpoint), Path(source), args, out)
    if args.install_size:
        print_install_sizes()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
