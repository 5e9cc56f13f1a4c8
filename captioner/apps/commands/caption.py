"""`captioner caption CHECKPOINT IMAGES...`: captions, n-best lists and samples, as text or JSON,
with attention, head-view and Grad-CAM figures on request."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from captioner.apps.arguments import add_decode_arguments, decode_options, expand_images
from captioner.core.errors import CaptionerError, ImageLoadError


def add_parser(commands: argparse._SubParsersAction) -> None:
    caption = commands.add_parser("caption", help="caption images or folders of images")
    caption.add_argument("checkpoint")
    caption.add_argument("images", nargs="+")
    add_decode_arguments(caption)
    caption.add_argument("--n-best", type=int, default=None, metavar="N",
                         help="N hypotheses per image, best first, each with its score (N <= beam; with --sample: N draws)")
    caption.add_argument("--sample", action="store_true", help="sample instead of searching (see --top-k, --top-p)")
    caption.add_argument("--temperature", type=float, default=1.0, help="with --sample: softmax temperature")
    caption.add_argument("--top-k", type=int, default=0, help="with --sample: draw from the K most probable words only")
    caption.add_argument("--top-p", type=float, default=1.0, help="with --sample: draw from the nucleus of mass P only")
    caption.add_argument("--seed", type=int, default=None, help="with --sample: seed, for reproducible draws")
    caption.add_argument("--attention", action="store_true", help="with --json: each word's attention map (h x w)")
    caption.add_argument("--json", action="store_true")
    caption.add_argument("--heatmaps", metavar="OUTDIR", help="write one attention figure per image (per hypothesis with --n-best) here")
    caption.add_argument("--layer", type=int, default=-1, help="decoder layer of the maps (transformer)")
    caption.add_argument("--head", type=int, default=None, help="attention head (default: mean over heads)")
    caption.add_argument("--self-attention", metavar="OUTDIR",
                         help="transformer: write each caption's self-attention head view (PNG and SVG) here")
    caption.add_argument("--head-grid", metavar="OUTDIR",
                         help="write each caption's cross-attention per layer and head, a grid of small maps per word, here")
    caption.add_argument("--saliency", choices=("gradcam",), default=None,
                         help="with --heatmaps: also draw each word's Grad-CAM beside its attention")
    caption.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.core.runtime import resolve_device
    from captioner.data.images import load_image
    from captioner.models.checkpoint import load_captioner
    from captioner.viz.overlays import save_attention_figure

    if not args.sample and (args.top_k or args.top_p != 1.0 or args.temperature != 1.0 or args.seed is not None):
        raise CaptionerError("caption: --top-k, --top-p, --temperature and --seed apply only with --sample")
    model = load_captioner(args.checkpoint, resolve_device(args.device))
    paths = expand_images(args.images)
    if not paths:
        raise CaptionerError("caption: no images given")
    if args.saliency and not args.heatmaps:
        raise CaptionerError("caption: --saliency draws beside the heatmaps; give --heatmaps OUTDIR too")
    options = decode_options(args)
    if args.self_attention:
        if not model.decoder.has_self_attention:
            raise CaptionerError(f"caption: --self-attention needs a transformer checkpoint; {args.checkpoint} has an "
                                 f"{model.config.decoder.type} decoder")
        options["self_attention"] = True
    if args.sample:
        options.update(sample=True, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    n_best = args.n_best if args.n_best is not None else (1 if args.sample else None)
    results = model.caption_files(paths, batch_size=args.batch_size, n_best=n_best, **options)
    failures = 0
    rows = []
    for path, result in zip(paths, results):
        if isinstance(result, ImageLoadError):
            failures += 1
            print(f"error: {result}", file=sys.stderr)
            continue
        hypotheses = result if isinstance(result, list) else [result]
        entries = []
        for rank, caption in enumerate(hypotheses, start=1):
            entry = caption.to_json()
            if args.attention:
                maps = caption.heatmaps(layer=args.layer, head=args.head)  # (T, h, w)
                entry["attention"] = [[[round(x, 4) for x in r] for r in m] for m in maps.tolist()]
            if args.heatmaps:
                suffix = f"_{rank}" if args.n_best is not None else ""
                figure = Path(args.heatmaps) / f"{path.stem}_attention{suffix}.png"
                save_attention_figure(figure, load_image(path), caption, layer=args.layer, head=args.head)
                entry["heatmaps"] = str(figure)
            entry |= interpret_figures(model, path, caption, args, f"_{rank}" if args.n_best is not None else "")
            entries.append(entry)
            if not args.json:
                print(f"{path}\t{hypotheses[0].text}" if args.n_best is None else f"{path}\t{rank}\t{caption.score:.4f}\t{caption.text}")
        row = {"image": str(path), **entries[0]}
        if args.n_best is not None:
            row["n_best"] = entries
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
    if failures:
        print(f"{failures} of {len(paths)} images failed", file=sys.stderr)
    return 1 if failures else 0


def interpret_figures(model, path: Path, caption, args: argparse.Namespace, suffix: str) -> dict[str, str]:
    """The figures `caption` was asked for beyond the heatmaps; their paths by kind."""
    from captioner.data.images import load_image
    from captioner.viz.figures import (
        head_grid_figure,
        head_view_figure,
        saliency_figure,
        save_figure,
    )

    written: dict[str, str] = {}
    if not caption.words:  # the model ended at once: no word to draw
        if args.self_attention or args.head_grid or args.saliency:
            print(f"{path}: empty caption, no per-word figures", file=sys.stderr)
        return written
    if args.self_attention:
        stem = Path(args.self_attention) / f"{path.stem}_self_attention{suffix}"
        png, _ = save_figure(head_view_figure(caption), stem.with_suffix(".png"), stem.with_suffix(".svg"))
        written["self_attention"] = str(png)
    if args.head_grid:
        (grid,) = save_figure(head_grid_figure(load_image(path), caption), Path(args.head_grid) / f"{path.stem}_heads{suffix}.png")
        written["head_grid"] = str(grid)
    if args.saliency == "gradcam":
        import torch

        from captioner.evaluation.interpret import caption_grad_cam

        image = load_image(path)
        with torch.no_grad():
            feats, _ = model.encode(model.transform(image)[None].to(model.device))  # (1, N, D)
        cams = caption_grad_cam(model, feats[0], caption, list(range(len(caption.words))))
        (figure,) = save_figure(
            saliency_figure(image, caption, cams, args.layer, args.head), Path(args.heatmaps) / f"{path.stem}_gradcam{suffix}.png"
        )
        written["gradcam"] = str(figure)
    return written
