"""`captioner caption [CHECKPOINT] IMAGES...`: captions, n-best lists and samples, as text or JSON, with
attention, head-view and Grad-CAM figures on request; without CHECKPOINT the default model captions."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from captioner.apps.arguments import (IMAGE_SUFFIXES, add_decode_arguments, add_ensemble_arguments,
                                      check_layer_and_head, decode_options, decode_value, expand_images, load_model,
                                      said_by_an_error, takes)
from captioner.apps.prerequisites import writable_folder
from captioner.core.errors import CaptionerError, ImageLoadError

if TYPE_CHECKING:  # loaded when used: `captioner caption --help` needs neither torch nor matplotlib
    import torch
    from PIL import Image

    from captioner.deploy import OnnxCaptioner
    from captioner.core.decode_results import Caption
    from captioner.models.captioner import Captioner
    from captioner.models.ensemble import Ensemble
    from captioner.viz.caption_figures import FigureRequest


def add_parser(commands: argparse._SubParsersAction) -> None:
    caption = commands.add_parser("caption", help="caption images or folders of images")
    caption.add_argument("checkpoint", nargs="?",
                         help="a .pt, a run folder, an export or a Hub id; left out when the first argument is an "
                              "image (or a folder of images): the default model, runs/default_model if exported, else "
                              "the packaged model, else runs/shapes_lstm")
    caption.add_argument("images", nargs="*", help="image files or folders of images (jpg, png, ...)")
    add_decode_arguments(caption)
    add_ensemble_arguments(caption)
    caption.add_argument("--n-best", type=decode_value("n_best"), default=None, metavar="N",
                         help=f"N hypotheses per image, best first, each with its score, {takes('n_best')} "
                              "(N <= beam; with --sample: N draws)")
    caption.add_argument("--sample", action="store_true", help="sample instead of searching (see --top-k, --top-p)")
    caption.add_argument("--temperature", type=decode_value("temperature"), default=None,
                         help=f"with --sample: softmax temperature, {takes('temperature')} (default 1)")
    caption.add_argument("--top-k", type=decode_value("top_k"), default=None,
                         help=f"with --sample: draw from the K most probable words only, {takes('top_k')} "
                              "(default 0: all)")
    caption.add_argument("--top-p", type=decode_value("top_p"), default=None,
                         help=f"with --sample: draw from the nucleus of mass P only, {takes('top_p')} (default 1)")
    caption.add_argument("--seed", type=decode_value("seed"), default=None,
                         help="with --sample: seed, for reproducible draws")
    caption.add_argument("--attention", action="store_true", help="with --json: each word's attention map (h x w)")
    caption.add_argument("--json", action="store_true",
                         help="one JSON object per image (words, scores; maps with --attention) instead of text")
    caption.add_argument("--heatmaps", metavar="OUTDIR",
                         help="write one attention figure per image (per hypothesis with --n-best) here")
    caption.add_argument("--layer", type=int, default=-1, help="decoder layer of the maps (transformer)")
    caption.add_argument("--head", type=int, default=None, help="attention head (default: mean over heads)")
    caption.add_argument("--self-attention", metavar="OUTDIR",
                         help="transformer: write each caption's self-attention head view (PNG and SVG) here")
    caption.add_argument("--head-grid", metavar="OUTDIR", help="write each caption's cross-attention per layer "
                                                               "and head, a grid of small maps per word, here")
    caption.add_argument("--saliency", choices=("gradcam",), default=None,
                         help="with --heatmaps: also draw each word's Grad-CAM beside its attention")
    caption.add_argument("--runtime", choices=("torch", "onnx"), default="torch",
                         help="onnx: run an export made with `captioner export --onnx` on onnxruntime, without torch "
                              "(greedy and beam search, n-best, --json --attention; no sampling or figures)")
    caption.set_defaults(func=run)


SAMPLING_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}


def one_field(path: Path) -> str:
    """A path as one field of the tab-separated output: a tab, newline or carriage return in a file's name written
    as \\t, \\n, \\r (as `ls -b` does), so each image stays one line of fields; the JSON keeps the name as it is."""
    return str(path).translate({9: "\\t", 10: "\\n", 13: "\\r"})


def checked_flags(args: argparse.Namespace) -> dict[str, object]:
    """Flags that need another, or do not go together, refused in one line before anything loads; the sampling
    flags given."""
    sampling = {name: getattr(args, name) for name in SAMPLING_FLAGS if getattr(args, name) is not None}
    if sampling and not args.sample:
        flags = [SAMPLING_FLAGS[name] for name in sampling]
        raise CaptionerError(f"caption: {', '.join(flags)} {'apply' if len(flags) > 1 else 'applies'} "
                             "only with --sample")
    searching = [flag for flag in ("--beam", "--diverse-groups", "--diversity-strength", "--length-penalty")
                 if getattr(args, flag[2:].replace("-", "_")) is not None]
    if args.sample and searching:
        raise CaptionerError(f"caption: {', '.join(searching)} {'shape' if len(searching) > 1 else 'shapes'} the beam "
                             "search, and --sample draws each word instead (leave out one or the other)")
    if args.attention and not args.json:
        raise CaptionerError("caption: --attention adds each word's map to the JSON; give --json too")
    if args.saliency and not args.heatmaps:
        raise CaptionerError("caption: --saliency draws beside the heatmaps; give --heatmaps OUTDIR too")
    if args.ensemble and (args.self_attention or args.saliency):
        flag = "--self-attention" if args.self_attention else "--saliency"
        raise CaptionerError(f"caption: {flag} looks inside one model; an ensemble (--ensemble) has several")
    return sampling


def run(args: argparse.Namespace) -> int:
    from captioner.data.image_files import load_image

    # --ensemble takes every word after it: images given after its checkpoints are still images.
    words, args.ensemble = args.ensemble, []
    for word in words:
        (args.images if is_image_input(word, args.runtime) else args.ensemble).append(word)
    sampling = checked_flags(args)
    args.checkpoint, args.images = named_model_and_images([args.checkpoint, *args.images] if args.checkpoint
                                                          else args.images, args.runtime)
    if args.checkpoint is not None and args.runtime == "torch":
        from captioner.models.model_paths import checkpoint_file

        checkpoint_file(args.checkpoint)  # a model that is not there is said first
    paths = images_to_caption(args.images, default=args.checkpoint is None)  # before the model loads
    for flag in ("heatmaps", "self_attention", "head_grid"):
        if getattr(args, flag):
            writable_folder(getattr(args, flag), f"caption --{flag.replace('_', '-')}")
    # Which model captions (its origin, its scores) is said once some image is captioned: a refusal is its one line.
    with said_by_an_error("captioner.models.model_paths", "captioner.models.model_origin", level=logging.INFO):
        args.checkpoint = args.checkpoint or default_model()
        model = onnx_model(args) if args.runtime == "onnx" else load_model("caption", args.checkpoint, args)
        options = decode_options(args)
        if args.self_attention:
            if not model.decoder.has_self_attention:
                raise CaptionerError(f"caption: --self-attention needs a transformer checkpoint; {args.checkpoint} has "
                                     f"an {model.config.decoder.type} decoder")
            options["self_attention"] = True
        if args.sample:
            options.update(sample=True, **sampling)
        n_best = args.n_best if args.n_best is not None else (1 if args.sample else None)
        if args.runtime == "torch":  # which model answers, and whether the pictures fit it (the runtime has no origin)
            from captioner.models.model_origin import announce, check_picture

            announce(model.origins)
            options["on_picture"] = lambda picture: check_picture(model.origins, picture)
        results = model.caption(paths, batch_size=args.batch_size, n_best=n_best, errors="return", **options)
        refuse_if_none_captioned(paths, results)
        check_map_choice(args.layer, args.head, results)
    request = figure_request(args)
    names = figure_names(paths) if request is not None else {}
    rows = []
    for path, result in zip(paths, results):
        if isinstance(result, ImageLoadError):
            print(f"error: {result}", file=sys.stderr)
            continue
        hypotheses = result if isinstance(result, list) else [result]
        image = load_image(path) if request is not None else None
        entries = []
        for rank, caption in enumerate(hypotheses, start=1):
            entry = caption.to_json()
            if args.attention:
                maps = caption.heatmaps(layer=args.layer, head=args.head)  # (T, h, w)
                entry["attention"] = [[[round(x, 4) for x in r] for r in m] for m in maps.tolist()]
            if request is not None:
                entry |= figures(model, path, names[path], image, caption, request,
                                 f"_{rank}" if args.n_best is not None else "")
            entries.append(entry)
            if not args.json:
                shown = one_field(path)
                print(f"{shown}\t{hypotheses[0].text}" if args.n_best is None
                      else f"{shown}\t{rank}\t{caption.score:.4f}\t{caption.text}")
        row = {"image": str(path), **entries[0]}
        if args.n_best is not None:
            row["n_best"] = entries
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
    failures = len(paths) - len(rows)
    if failures:
        print(f"{failures} of {len(paths)} images failed", file=sys.stderr)
    return 1 if failures else 0


def images_to_caption(inputs: list[str], default: bool) -> list[Path]:
    """The image files the inputs name (folders expanded), checked before any model loads: none existing is one
    line (after a missing default model's, when `default`)."""
    paths = expand_images(inputs)
    if not paths:
        raise CaptionerError(f"caption: no images in {', '.join(inputs)}")
    if not any(path.exists() for path in paths):
        if default:
            before = logging.root.manager.disable
            logging.disable(logging.INFO)  # which model would have captioned is no news beside the error
            try:
                default_model()
            finally:
                logging.disable(before)
        from captioner.data.image_files import missing

        raise ImageLoadError(f"{paths[0]}: {missing(paths[0])}" if len(paths) == 1
                             else f"caption: none of the {len(paths)} images exist (e.g. {paths[0]})")
    return paths


def refuse_if_none_captioned(paths: list[Path], results: Sequence[object]) -> None:
    """Every image unreadable is one line; some of them a partial failure (each named, a count, exit status 1)."""
    errors = [result for result in results if isinstance(result, ImageLoadError)]
    if errors and len(errors) == len(paths):
        raise errors[0] if len(paths) == 1 else ImageLoadError(
            f"caption: none of the {len(paths)} images could be read (e.g. {errors[0]})")


def check_map_choice(layer: int, head: int | None, results: Sequence[object]) -> None:
    """--layer and --head within the attention maps of the captions (T, L, H, ...), before anything is printed."""
    first = next((r[0] if isinstance(r, list) else r for r in results if not isinstance(r, ImageLoadError)), None)
    attn = getattr(first, "attn", None)  # a tensor, or the ONNX runtime's array: no torch imported for it
    if attn is not None and attn.ndim >= 3:
        check_layer_and_head("caption", layer, head, attn.shape[1], attn.shape[2])


def model_and_images(inputs: list[str], runtime: str = "torch") -> tuple[str, list[str]]:
    """The model and the images among the positionals: the first names the model unless it is an image."""
    named, images = named_model_and_images(inputs, runtime)
    return named if named is not None else default_model(), images


def default_model() -> str:
    """The default model's path (what captions when no model is named)."""
    from captioner.models.model_paths import find_default_model  # torch: loaded once a model is

    return str(find_default_model())


def named_model_and_images(inputs: list[str], runtime: str = "torch") -> tuple[str | None, list[str]]:
    """`model_and_images` with the model None where the default one captions, not yet looked up."""
    if not inputs:
        raise CaptionerError("caption: no images given")
    if not is_image_input(inputs[0], runtime):
        if len(inputs) == 1:
            raise CaptionerError(f"caption: no images given after the model {inputs[0]} (a first argument that is an "
                                 "image file or a folder of images is captioned with the default model)")
        return inputs[0], inputs[1:]
    if runtime == "onnx":  # the default may be a PyTorch run, which onnxruntime cannot load
        raise CaptionerError("caption --runtime onnx: name the exported folder to run first (e.g. runs/default_model)")
    return None, inputs


def is_image_input(item: str, runtime: str = "torch") -> bool:
    """An image file (by its extension) or, but for the ONNX runtime, a folder of images with no model in it."""
    return Path(item).suffix.lower() in IMAGE_SUFFIXES or (runtime != "onnx" and image_folder(Path(item)))


def image_folder(path: Path) -> bool:
    """A folder holding images and no model (no best.pt, last.pt or config.json): the images to caption."""
    from captioner.models.export_format import CONFIG
    from captioner.models.model_paths import RUN_CHECKPOINTS

    return (path.is_dir() and not any((path / name).is_file() for name in (*RUN_CHECKPOINTS, CONFIG))
            and any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.iterdir()))


ONNX_REFUSES = {"sample": "--sample", "heatmaps": "--heatmaps", "self_attention": "--self-attention",
                "head_grid": "--head-grid", "saliency": "--saliency", "ensemble": "--ensemble"}


def onnx_model(args: argparse.Namespace) -> OnnxCaptioner:
    """The ONNX runtime on an export's onnx/ graphs; the options it cannot serve refused in one line."""
    from captioner.deploy import OnnxCaptioner

    refused = [flag for name, flag in ONNX_REFUSES.items() if getattr(args, name, None)]
    if refused:
        raise CaptionerError(
            f"caption --runtime onnx: {', '.join(refused)} need the PyTorch runtime (leave out --runtime onnx)")
    return OnnxCaptioner.from_folder(args.checkpoint)


def figure_request(args: argparse.Namespace) -> FigureRequest | None:
    """The figures asked for, or None (plotting is loaded only when some are)."""
    if not (args.heatmaps or args.self_attention or args.head_grid):
        return None
    from captioner.viz.caption_figures import FigureRequest

    folder = {name: Path(getattr(args, name)) if getattr(args, name) else None
              for name in ("heatmaps", "self_attention", "head_grid")}
    gradcam = folder["heatmaps"] if args.saliency == "gradcam" else None  # drawn beside the heatmaps
    return FigureRequest(**folder, gradcam=gradcam, layer=args.layer, head=args.head)


def figure_names(paths: list[Path]) -> dict[Path, str]:
    """The name each image's figures start with: its file's stem, numbered in the order given (x-1, x-2) where
    several images share one (a/x.jpg, b/x.jpg), so that no figure overwrites another; each such stem is said."""
    stems: dict[str, list[Path]] = {}
    for path in dict.fromkeys(paths):
        stems.setdefault(path.stem, []).append(path)
    names = {}
    for stem, shared in stems.items():
        names |= {shared[0]: stem} if len(shared) == 1 else {p: f"{stem}-{i}" for i, p in enumerate(shared, 1)}
        if len(shared) > 1:
            print(f"note: {len(shared)} images are named {stem}: their figures are {stem}-1 to {stem}-{len(shared)}, "
                  "in the order given", file=sys.stderr)
    return names


def figures(model: Captioner | Ensemble, path: Path, name: str, image: Image.Image, caption: Caption,
            request: FigureRequest, suffix: str) -> dict[str, str]:
    """Draw a caption's requested figures, their files' names starting with `name` (Grad-CAM computed first when
    asked); their paths by kind."""
    from captioner.viz.caption_figures import save_caption_figures

    if request.per_word and not caption.words:  # the model ended at once: no word to draw
        print(f"{path}: empty caption, no per-word figures", file=sys.stderr)
    cams = grad_cams(model, image, caption) if request.gradcam is not None and caption.words else None
    written = save_caption_figures(image, caption, request, name, suffix, cams)
    return {kind: str(file) for kind, file in written.items()}


def grad_cams(model: Captioner, image: Image.Image, caption: Caption) -> dict[int, torch.Tensor]:
    """Each word's Grad-CAM map (h, w) over the image's grid, by word position."""
    import torch

    from captioner.evaluation.grounding import caption_grad_cam

    with torch.no_grad():
        feats, _ = model.encode(model.transform(image)[None].to(model.device))  # (1, N, D)
    return caption_grad_cam(model, feats[0], caption, list(range(len(caption.words))))
