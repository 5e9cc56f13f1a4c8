"""The `captioner` command line: thin wrappers over the library.

User mistakes (`CaptionerError`) print one line and exit 2; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from pathlib import Path

from captioner.core.errors import CaptionerError, ImageLoadError

log = logging.getLogger("captioner")

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s" if verbose else "%(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("matplotlib", "PIL", "urllib3", "httpx", "httpcore", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# --- data -------------------------------------------------------------------------------------


def cmd_data_shapes(args: argparse.Namespace) -> int:
    from captioner.data.shapes import generate_shapes

    start = time.time()
    counts = generate_shapes(
        args.out, args.num_train, args.num_val, args.num_test, args.image_size, args.seed, args.format, progress=not args.quiet
    )
    total = sum(counts.values())
    seconds = time.time() - start
    print(f"wrote {total} images ({', '.join(f'{k} {v}' for k, v in counts.items())}) to {args.out} "
          f"in {seconds:.1f}s ({total / max(seconds, 1e-9):.0f} images/s)")
    return 0


def cmd_data_coco(args: argparse.Namespace) -> int:
    from captioner.data.download import download_coco

    paths = download_coco(Path(args.root), str(args.year), karpathy=args.karpathy, mirror=args.mirror)
    print(f"COCO {args.year} ready under {args.root} ({len(paths)} archives extracted)")
    return 0


def cmd_data_stats(args: argparse.Namespace) -> int:
    from captioner.data.coco import load_coco_captions, load_karpathy
    from captioner.data.datasets import load_split
    from captioner.data.flickr8k import load_flickr8k
    from captioner.data.shapes import SPLITS
    from captioner.data.stats import dataset_stats, format_table

    start = time.time()
    if args.coco:
        records, source = load_coco_captions(args.coco, Path(args.coco).parent, check_images=False), args.coco
    elif args.karpathy:
        records = [r for s in SPLITS for r in load_karpathy(args.karpathy, ".", s, check_images=False)]
        source = args.karpathy
    elif args.flickr8k:
        records = [r for s in SPLITS for r in load_flickr8k(args.flickr8k, s, check_images=False)]
        source = args.flickr8k
    elif args.config:
        from captioner.core.config import load_config

        config = load_config(args.config, args.overrides)
        records = [r for s in SPLITS for r in load_split(config.data, s, check_images=False)]
        source = f"{config.data.dataset} ({args.config})"
    else:
        raise CaptionerError("data stats: give --coco FILE, --karpathy FILE, --flickr8k DIR or a CONFIG")
    stats = dataset_stats(records, args.min_count)
    if args.flickr8k or args.config:
        stats = _with_images_on_disk(stats, records)
    stats["seconds"] = round(time.time() - start, 2)
    if args.json:
        print(json.dumps(stats, indent=1))
    else:
        print(format_table(stats, f"{source}"))
    return 0


def _with_images_on_disk(stats: dict, records: list) -> dict:
    on_disk = sum(1 for r in records if r.path.is_file())
    return {**stats, "images on disk": on_disk, "images missing": len(records) - on_disk}


# --- train / caption / evaluate ----------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from captioner.core.config import load_config
    from captioner.training.fit import fit

    overrides = [*args.overrides, *([f"train.init={args.init}"] if args.init else [])]
    config = load_config(args.config, overrides)
    if config.train.threads:
        from captioner.core.runtime import set_threads

        set_threads(config.train.threads)  # the run's own setting beats the process default set in main
    best = fit(config, resume=args.resume)
    print(f"best checkpoint: {best}")
    return 0


def cmd_features(args: argparse.Namespace) -> int:
    """Encode each split once into the fp16 feature store (resumes a stopped extraction)."""
    from captioner.core.config import load_config
    from captioner.core.runtime import resolve_device
    from captioner.data.datasets import load_split
    from captioner.data.shapes import SPLITS
    from captioner.data.store import check_frozen, ensure_store, size_text, store_dir
    from captioner.models.build import build_model
    from captioner.text.vocab import Vocabulary

    config = load_config(args.config, args.overrides)
    if args.out:
        config.data.feature_store = args.out
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    unknown = [s for s in splits if s not in SPLITS]
    if unknown or not splits:
        bad = ",".join(unknown) or repr(args.splits)
        raise CaptionerError(f"features --splits: {bad} is not a split; use {','.join(SPLITS)}")
    model = build_model(config, Vocabulary.build([])).to(resolve_device(config.train.device, "train.device"))  # only the encoder runs
    check_frozen(model)
    directory = store_dir(config)
    for split in splits:
        start = time.time()
        store = ensure_store(model, directory, split, load_split(config.data, split), config.data.batch_size, config.data.num_workers)
        failed = len(store.failed_rows)
        print(f"{split}: {store.num_rows} images ({failed} failed to load) x {store.grid[0]}x{store.grid[1]} x "
              f"{store.feat_dim} fp16, {size_text(store.nbytes())}: {store.array_path} ({time.time() - start:.1f}s)")
    return 0


def expand_images(inputs: list[str]) -> list[Path]:
    """Files as given, folders as the images inside them (sorted)."""
    paths: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                log.warning("%s: no images in this folder", path)
            paths += found
        else:
            paths.append(path)  # a missing file gets its own error line when loaded
    return paths


def decode_options(args: argparse.Namespace) -> dict:
    """The decoding options shared by `caption` and `evaluate`; None leaves the config's value."""
    return {
        "beam_size": args.beam,
        "max_length": args.max_length,
        "block_trigrams": True if args.block_trigrams else None,
        "diverse_groups": args.diverse_groups,
        "diversity_strength": args.diversity_strength,
    }


def cmd_caption(args: argparse.Namespace) -> int:
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
                                 f"{model.config.model.decoder.type} decoder")
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


def cmd_evaluate(args: argparse.Namespace) -> int:
    from captioner.evaluation.evaluate import run_evaluation

    report = run_evaluation(args)
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        from captioner.apps.demo import serve
    except ModuleNotFoundError as e:
        if e.name != "gradio":
            raise
        raise CaptionerError("demo: Gradio is not installed (pip install -e '.[demo]')") from None

    examples = expand_images(args.examples) if args.examples else None
    serve([Path(c) for c in args.checkpoints], examples, host=args.host, port=args.port)
    return 0


# --- parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner", description="Image captioning with spatial attention.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    data = commands.add_parser("data", help="generate, download or describe datasets")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    shapes = data_commands.add_parser("shapes", help="generate the synthetic shapes world in COCO format")
    shapes.add_argument("--out", required=True, help="output folder")
    shapes.add_argument("--num-train", type=int, default=4000)
    shapes.add_argument("--num-val", type=int, default=250)
    shapes.add_argument("--num-test", type=int, default=500)
    shapes.add_argument("--image-size", type=int, default=128)
    shapes.add_argument("--seed", type=int, default=0)
    shapes.add_argument("--format", choices=("jpg", "png"), default="jpg")
    shapes.add_argument("--quiet", action="store_true", help="no progress bar")
    shapes.set_defaults(func=cmd_data_shapes)

    coco = data_commands.add_parser("coco", help="download the official COCO images and captions (resumable)")
    coco.add_argument("--root", required=True)
    coco.add_argument("--year", type=int, choices=(2014, 2017), default=2014)
    coco.add_argument("--karpathy", action="store_true", help="also fetch Karpathy's split files")
    coco.add_argument("--mirror", help="base URL of a mirror to use instead of the official hosts")
    coco.set_defaults(func=cmd_data_coco)

    stats = data_commands.add_parser("stats", help="images, captions, caption lengths, vocabulary size")
    source = stats.add_mutually_exclusive_group()
    source.add_argument("--coco", help="a COCO-format caption file")
    source.add_argument("--karpathy", help="a Karpathy split file (dataset_*.json)")
    source.add_argument("--flickr8k", help="a folder with Flickr8k.token.txt and the split files")
    stats.add_argument("config", nargs="?", help="or a training config")
    stats.add_argument("overrides", nargs="*", help="section.key=value")
    stats.add_argument("--min-count", type=int, default=5)
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(func=cmd_data_stats)

    train = commands.add_parser("train", help="train a captioner from a YAML config")
    train.add_argument("config")
    train.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.epochs=5")
    train.add_argument("--resume", action="store_true", help="continue from train.out_dir/last.pt")
    train.add_argument(
        "--init", metavar="CHECKPOINT", help="start from this checkpoint's model and vocabulary (e.g. SCST after cross-entropy); sets train.init"
    )
    train.set_defaults(func=cmd_train)

    features = commands.add_parser("features", help="encode the images once into the fp16 feature store (frozen encoder)")
    features.add_argument("config")
    features.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.device=cuda")
    features.add_argument("--splits", default="train,val,test", help="comma-separated (default: train,val,test)")
    features.add_argument("--out", help="store folder (default: data.feature_store, else <train.out_dir>/features)")
    features.set_defaults(func=cmd_features)

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
    caption.set_defaults(func=cmd_caption)

    evaluate = commands.add_parser("evaluate", help="score a checkpoint on a split, or a results file")
    evaluate.add_argument("checkpoint", nargs="?")
    evaluate.add_argument("--split", default="test", choices=("train", "val", "test"))
    evaluate.add_argument(
        "--out",
        help="folder (or .json file with --results) for results and scores (default: next to the checkpoint; "
        "with --results, runs/eval/<results name>_scores.json)",
    )
    evaluate.add_argument("--limit", type=int, default=0, help="evaluate the first N images only")
    evaluate.add_argument("--results", help="score a COCO-format results file instead of a checkpoint")
    evaluate.add_argument("--annotations", help="the COCO caption annotation file for --results")
    evaluate.add_argument("--features", metavar="DIR", help="decode the frozen encoder's feature store in DIR (built there when absent)")
    evaluate.add_argument("--fast", action="store_true", help="in-process BLEU/CIDEr-D instead of the official code")
    evaluate.add_argument("--spice", action="store_true", help="also SPICE (needs its Stanford CoreNLP models)")
    evaluate.add_argument("--grounding", action="store_true", help="score attention against instance masks")
    evaluate.add_argument("--instances", help="COCO instances_*.json for --grounding (shapes: found by itself)")
    evaluate.add_argument("--heatmaps", metavar="OUTDIR", help="with --grounding: figures of the first images, true regions outlined")
    evaluate.add_argument("--saliency", choices=("gradcam",), default=None,
                          help="with --grounding: also score Grad-CAM of each grounded word (one gradient pass per caption)")
    evaluate.add_argument("--layer", type=int, default=-1, help="decoder layer of the maps (transformer)")
    evaluate.add_argument("--head", type=int, default=None, help="attention head (default: mean over heads)")
    add_decode_arguments(evaluate)
    evaluate.add_argument("--json", action="store_true")
    evaluate.set_defaults(func=cmd_evaluate)

    demo = commands.add_parser("demo", help="serve the Gradio page: captions with per-word attention heatmaps")
    demo.add_argument("checkpoints", nargs="*", help="models to offer (default: the quickstart's, trained first if missing)")
    demo.add_argument("--examples", nargs="+", help="example images or folders (default: the first model's test images)")
    demo.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve other machines")
    demo.add_argument("--port", type=int, default=7860)
    demo.set_defaults(func=cmd_demo)
    return parser


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--beam", type=positive_int, default=None, help="beam width (1 = greedy; default from the config)")
    parser.add_argument("--max-length", type=positive_int, default=None, help="words per caption (default from the config)")
    parser.add_argument("--block-trigrams", action="store_true", help="never repeat a word trigram within a caption")
    parser.add_argument("--diverse-groups", type=int, default=None, metavar="G",
                        help="diverse beam search with G groups of beam/G beams (default from the config)")
    parser.add_argument("--diversity-strength", type=float, default=None, metavar="LAMBDA",
                        help="Hamming diversity penalty between groups (default from the config)")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="images per batch (default: the config's decode.batch_size)")
    parser.add_argument("--device", default="auto")


def main(argv: list[str] | None = None) -> int:
    from captioner.training import distributed

    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    try:
        from captioner.core.runtime import set_threads

        set_threads()  # $CAPTIONER_THREADS or the default, before any torch work
        return args.func(args)
    except CaptionerError as e:
        print(f"error: {distributed.rank_prefix()}{e}", file=sys.stderr)
        if distributed.launched():  # one of several ranks: leave now, torchrun stops the others
            distributed.abort(2)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if distributed.launched():
            if distributed.peer_failed(e):  # the rank that failed has printed why
                first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                print(f"error: {distributed.rank_prefix()}stopped because another rank failed ({first})", file=sys.stderr)
            else:  # a bug on this rank: its traceback, then every rank stops
                print(f"error: {distributed.rank_prefix()}unexpected failure:", file=sys.stderr)
                traceback.print_exc()
            distributed.abort(1)
        raise


if __name__ == "__main__":
    sys.exit(main())
