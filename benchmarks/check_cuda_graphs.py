"""A trained model's captions with its decoder step eager and replayed as a CUDA graph
(`decode.cuda_graphs`): how many are the same, and decoding speed at batch 1 and at a full batch.
Needs a CUDA GPU (`--device cpu` only rehearses the script)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from captioner.apps.arguments import decode_value, positive_int
from captioner.data.image_files import load_image
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import load_captioner
from captioner.models.decoder import use_graphed_step

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_gpu import measured_device, median_seconds  # noqa: E402
from benchmarks.timing import argument_parser, print_environment, run_main  # noqa: E402


def decode_all(model: Captioner, feats: torch.Tensor, grid: tuple[int, int], beam: int,
               one_by_one: bool) -> list[str]:
    with torch.autocast(feats.device.type, dtype=torch.bfloat16, enabled=feats.device.type == "cuda"):
        if one_by_one:
            return [model.decode(feats[i : i + 1], grid, beam_size=beam)[0].text for i in range(feats.shape[0])]
        return [c.text for c in model.decode(feats, grid, beam_size=beam)]


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("cuda_graphs", __doc__)
    parser.add_argument("checkpoint")
    parser.add_argument("images", type=Path)
    parser.add_argument("--beams", type=decode_value("beam_size"), nargs="+", default=[1, 3])
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to rehearse the script")
    args = parser.parse_args(argv)
    device = measured_device(args.device)
    if not args.images.is_dir():
        raise SystemExit(f"{args.images}: not a folder of images")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: check_cuda_graphs needs a CUDA GPU (on the CPU, decode.cuda_graphs is ignored)",
              file=sys.stderr)
        return 2
    paths = sorted(p for p in args.images.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[: args.batch]
    if not paths:
        print(f"error: {args.images}: no .jpg or .png images", file=sys.stderr)
        return 2
    print_environment(args)
    model = load_captioner(args.checkpoint, device=device)
    images = torch.stack([model.transform(load_image(p)) for p in paths]).to(device)  # (B, 3, S, S) uint8
    with torch.no_grad():
        feats, grid = model.encode(images)  # (B, N, D)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (a rehearsal: no graphs)"
    print(f"{args.checkpoint}: {model.config.decoder.type}, {len(paths)} images, {where}, torch {torch.__version__}")
    print("| beam | images at once | eager images/s | CUDA graph images/s | speed-up | same captions |")
    print("|---:|---:|---:|---:|---:|---:|")
    graph = use_graphed_step(model.decoder)  # one wrapper: its graphs are captured once per shape
    for beam in args.beams:
        for one_by_one in (True, False):
            model.decoder.__dict__["step"] = graph.eager
            eager: list[str] = []
            eager_s = median_seconds(
                lambda: eager.__setitem__(slice(None), decode_all(model, feats, grid, beam, one_by_one)),
                args.repeats, device)
            model.decoder.__dict__["step"] = graph
            graphed: list[str] = []
            graphed_s = median_seconds(
                lambda: graphed.__setitem__(slice(None), decode_all(model, feats, grid, beam, one_by_one)),
                args.repeats, device)
            same = sum(a == b for a, b in zip(eager, graphed))
            n = len(paths)
            print(f"| {beam} | {1 if one_by_one else n} | {n / eager_s:.1f} | {n / graphed_s:.1f} | "
                  f"{eager_s / graphed_s:.2f}x | {same}/{n} |")
            for a, b in zip(eager, graphed):
                if a != b:
                    print(f"  differs: eager {a!r} / graph {b!r}")
                    break
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
