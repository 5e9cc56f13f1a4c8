"""`captioner evaluate`: a checkpoint on a split, or a COCO results file: metrics, grounding and saliency."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captioner.apps.arguments import (add_decode_arguments, add_ensemble_arguments, check_layer_and_head,
                                      decode_options, load_model, nonnegative_int, said_by_an_error)
from captioner.apps.prerequisites import require_data, require_official_metrics, writable_folder
from captioner.core.errors import CaptionerError

if TYPE_CHECKING:  # loaded when used: `captioner evaluate --help` needs neither torch nor the metrics
    from captioner.core.config_sections import DataConfig
    from captioner.data.records import ImageRecord
    from captioner.evaluation.evaluate import Evaluation, GroundingRequest, Scores

log = logging.getLogger(__name__)

DEFAULT_EVAL_DIR = "runs/eval"  # `evaluate --results` without --out writes its scores here
FIGURES = 8  # --heatmaps: figures of this many first images


def add_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("evaluate", help="score a checkpoint on a split, or a results file")
    evaluate.add_argument("checkpoint", nargs="?",
                          help="a .pt, a run folder, an export or a Hub id (left out with --results)")
    evaluate.add_argument("data_overrides", nargs="*", metavar="data.KEY=VALUE",
                          help="where the checkpoint's dataset is on this machine, for a moved or shared checkpoint: "
                               "data.root=..., data.image_root=..., data.test_shards=... (a model's own settings "
                               "never name shards, URLs or places outside this folder)")
    evaluate.add_argument("--split", default="test", choices=("train", "val", "test"),
                          help="the split of the checkpoint's data to caption and score")
    evaluate.add_argument("--out", help="folder (or .json file with --results) for results and scores (default: "
                                        "next to the checkpoint; with --results, runs/eval/<results name>_scores.json)")
    evaluate.add_argument("--limit", type=nonnegative_int, default=0, help="evaluate the first N images only (0: all)")
    evaluate.add_argument("--results", help="score a COCO-format results file instead of a checkpoint")
    evaluate.add_argument("--annotations", help="the COCO caption annotation file for --results")
    evaluate.add_argument("--features", metavar="DIR", help="decode the rows of the feature store in DIR (what the "
                                                            "encoder's frozen blocks make; built there when absent)")
    evaluate.add_argument("--fast", action="store_true", help="in-process BLEU/CIDEr-D instead of the official code")
    evaluate.add_argument("--spice", action="store_true", help="also SPICE (needs its Stanford CoreNLP models)")
    evaluate.add_argument("--grounding", action="store_true", help="score attention against instance masks")
    evaluate.add_argument("--instances", help="COCO instances_*.json for --grounding (shapes: found by itself)")
    evaluate.add_argument("--heatmaps", metavar="OUTDIR",
                          help="with --grounding: figures of the first images, true regions outlined")
    evaluate.add_argument("--saliency", choices=("gradcam",), default=None,
                          help="with --grounding: also score Grad-CAM of each grounded word "
                               "(one gradient pass per caption)")
    evaluate.add_argument("--layer", type=int, default=-1, help="decoder layer of the maps (transformer)")
    evaluate.add_argument("--head", type=int, default=None, help="attention head (default: mean over heads)")
    add_decode_arguments(evaluate)
    add_ensemble_arguments(evaluate)
    evaluate.add_argument("--json", action="store_true", help="print the scores as JSON instead of a table")
    evaluate.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Score with the official COCO code (`--fast`: in-process BLEU/CIDEr-D); write results and scores."""
    if args.spice and args.fast:
        raise CaptionerError("evaluate: --spice is one of the official metrics, and --fast scores without them")
    report = score_results_file(args) if args.results or args.annotations else score_checkpoint(args)
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


def score_results_file(args: argparse.Namespace) -> dict[str, Any]:
    """Score a COCO results file; the scores go to --out or runs/eval, never beside it (perhaps read-only data)."""
    from captioner.evaluation.evaluate import score_predictions
    from captioner.evaluation.results_files import load_references, load_results, rounded, write_scores_json

    if not (args.results and args.annotations):
        raise CaptionerError("evaluate: --results and --annotations go together")
    if args.grounding:
        raise CaptionerError("evaluate: --grounding needs a CHECKPOINT (attention maps), not a results file")
    if not args.fast:
        require_official_metrics(args.spice)
    out = scores_file(args)
    references = load_references(args.annotations)
    predictions = load_results(args.results, references)
    scores = score_predictions(references, predictions, official=not args.fast, spice=args.spice)
    report = {"results": str(args.results), "annotations": str(args.annotations),
              "images": len(scores.per_image) or None, **scores.beside_official()}
    write_scores_json(out, scores.overall, scores.per_image, extra=report)
    if not args.json:
        print_scores(f"{args.results} against {args.annotations}", scores, verbose=args.verbosity > 0)
        print(f"scores: {out}")
    return {**report, "scores": rounded(scores.overall), "scores_file": str(out)}


def scores_file(args: argparse.Namespace) -> Path:
    """Where `evaluate --results` writes its scores, checked before any scoring: --out's folder can be made, and
    the file there is new or an earlier scores file, never the results, the annotations or another file."""
    from captioner.evaluation.results_files import is_scores_file

    given = Path(args.out) if args.out else None
    if given is not None and given.suffix != ".json" and given.exists() and not given.is_dir():
        raise CaptionerError(f"evaluate --out {given}: a file, not a folder (nor a .json file for the scores)")
    out = given or Path(DEFAULT_EVAL_DIR) / f"{Path(args.results).stem}_scores.json"
    out = out / "scores.json" if out.suffix != ".json" or out.is_dir() else out  # a folder, whatever its name
    for name, path in (("--results", args.results), ("--annotations", args.annotations)):
        if out.exists() and Path(path).exists() and out.samefile(path):
            raise CaptionerError(f"evaluate --out {out}: that is the {name} file; the scores go to a file of their own")
    if out.exists() and not is_scores_file(out):
        raise CaptionerError(f"evaluate --out {out}: a file that is not a scores file; it is kept (name another "
                             "--out, or delete it)")
    writable_folder(out.parent, "evaluate --out")
    return out


def score_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    """Caption the checkpoint's split (images, or --features rows) and score it; files go to --out or beside it."""
    from captioner.data import datasets  # noqa: F401 - the loaders' 'train' extra, said before the model loads
    from captioner.evaluation.evaluate import evaluate
    from captioner.evaluation.results_files import rounded, write_scores_json
    from captioner.models.model_paths import checkpoint_file

    check_checkpoint_arguments(args)
    if not args.fast:  # before any image is captioned
        require_official_metrics(args.spice)
    checkpoint = checkpoint_file(args.checkpoint)  # a run folder: its best.pt, else last.pt
    model = load_model("evaluate", checkpoint, args)
    if args.grounding:  # the maps it scores: a layer or head the model lacks is said before its data is read
        check_layer_and_head("evaluate", args.layer, args.head, *model.attention_shape())
    if args.heatmaps:  # its figures come last: a place they cannot go is said first
        writable_folder(args.heatmaps, "evaluate --heatmaps")
    config, records, all_records = checkpoint_split(checkpoint, args)
    grounding = grounding_request(args, config.data) if args.grounding else None
    options = {**decode_options(args), "beam_size": args.beam or model.decode_config.beam_size}
    out_dir = Path(args.out) if args.out else default_out_dir(checkpoint, args.ensemble)
    results_path = out_dir / f"results_{args.split}.json"
    writable_folder(out_dir, "evaluate --out")  # before any caption is made, not after all of them
    scored, stored = (stored_rows(args.features, model, config, args.split, records, all_records)
                      if args.features else (records, {}))
    evaluation = evaluate(model, scored, official=not args.fast, spice=args.spice, grounding=grounding,
                          results_file=results_path, batch_size=args.batch_size, **stored, **options)
    report = checkpoint_report(args, checkpoint, evaluation, options, results_path)
    if evaluation.grounding is not None and args.heatmaps:
        outlined_figures(Path(args.heatmaps), records, evaluation)
    scores_path = out_dir / f"scores_{args.split}.json"
    write_scores_json(scores_path, evaluation.scores.overall, evaluation.scores.per_image, extra=report)
    if not args.json:
        print_checkpoint_scores(args, checkpoint, records, evaluation, report, out_dir,
                                {"captions": results_path, "scores": scores_path})
    return {**report, "scores": rounded(evaluation.scores.overall)}


def check_checkpoint_arguments(args: argparse.Namespace) -> None:
    """Refuse, in one line, flags that do not go together, before anything is loaded."""
    if not args.checkpoint:
        raise CaptionerError("evaluate: give a CHECKPOINT, or --results FILE --annotations FILE")
    if args.heatmaps and not args.grounding:
        raise CaptionerError("evaluate: --heatmaps draws the grounded words' maps over their regions; it needs "
                             "--grounding")
    if args.saliency and not args.grounding:
        raise CaptionerError("evaluate: --saliency scores saliency maps against instance masks; it needs --grounding")
    if args.ensemble and (args.features or args.saliency):
        flag = "--features" if args.features else "--saliency"
        raise CaptionerError(f"evaluate: {flag} works on one model; an ensemble (--ensemble) encodes the images "
                             "with each member's encoder")


def checkpoint_split(checkpoint: Path, args: argparse.Namespace) -> tuple[Any, list[ImageRecord], list[ImageRecord]]:
    """The model's own settings, and the split's records: the first --limit of them, and all of them."""
    from captioner.models.checkpoint import model_settings

    with said_by_an_error("captioner.data.model_settings"):  # a place set aside, then refused: the refusal's line alone
        settings = model_settings(checkpoint, args.data_overrides)
        config = settings.config
        if not settings.unreadable(args.split):
            require_data(config.data, [args.split])
        all_records = settings.load_split(args.split)  # one line when the model's settings name a place it may not
    return config, all_records[: args.limit] if args.limit else all_records, all_records


def stored_rows(features: str, model: Any, config: Any, split: str, records: list[ImageRecord],
                all_records: list[ImageRecord]) -> tuple[list[ImageRecord], dict[str, Any]]:
    """--features DIR: the records whose rows are stored, and what `evaluate` decodes instead of images."""
    from captioner.data.store_extract import split_features

    config.data.feature_store = features
    stored = split_features(model, config, split, all_records, use=records)
    return stored.records, {"features": stored.features, "grid": stored.grid, "num_workers": config.data.num_workers}


def checkpoint_report(args: argparse.Namespace, checkpoint: Path, evaluation: Evaluation, options: dict[str, Any],
                      results_path: Path) -> dict[str, Any]:
    """What the scores file records beside the scores: the model(s), the split, the decoding, the files."""
    report: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        **({"ensemble": [str(checkpoint), *args.ensemble], "combine": args.combine or "prob"} if args.ensemble else {}),
        "split": args.split, "images": len(evaluation.captions), "beam_size": options["beam_size"],
        "decode": {k: v for k, v in options.items() if v is not None}, "metrics": evaluation.scores.metrics,
        "results": str(results_path), **evaluation.scores.beside_official(),
    }
    if evaluation.grounding is not None:
        report["grounding"] = evaluation.grounding.to_json()
    return report


def print_checkpoint_scores(args: argparse.Namespace, checkpoint: Path, records: list[ImageRecord],
                            evaluation: Evaluation, report: dict[str, Any], out_dir: Path,
                            files: dict[str, Path]) -> None:
    """The table, the grounding, three example captions, where the files are, and what to run next."""
    scores = evaluation.scores
    name = " + ".join([str(checkpoint), *args.ensemble])
    title = f"{name} on {args.split} ({len(evaluation.captions)} images, beam {report['beam_size']}, {scores.metrics})"
    print_scores(title, scores, verbose=args.verbosity > 0)
    if "grounding" in report:
        print_grounding(report["grounding"])
    for record in records[:3]:
        if record.image_id in evaluation.captions:
            print(f"  e.g. {record.path.name}: {evaluation.captions[record.image_id].text!r}")
    print(f"captions: {files['captions']}\nscores: {files['scores']}")
    if records and not args.ensemble:
        heatmaps = ["--heatmaps", str(out_dir / "heatmaps")]  # the first image's word-by-word attention figures
        print(f"next: {shlex.join(['captioner', 'caption', str(checkpoint), str(records[0].path), *heatmaps])}")


def default_out_dir(checkpoint: Path, ensemble: list[str]) -> Path:
    """Beside the checkpoint (an ensemble's in a subfolder named after its members); an export's in runs/eval/<name>."""
    base = Path(DEFAULT_EVAL_DIR) / checkpoint.name if checkpoint.is_dir() else checkpoint.parent
    if not ensemble:
        return base
    names = [path.parent.name if path.stem in ("best", "last") else path.stem for path in map(Path, ensemble)]
    return base / ("ensemble_" + "_".join(names))


def grounding_request(args: argparse.Namespace, data: DataConfig) -> GroundingRequest:
    """--grounding's instances (--instances, or the shapes world's own file) and maps."""
    from captioner.evaluation.evaluate import GroundingRequest
    from captioner.evaluation.grounding import Instances

    if args.instances:
        path = Path(args.instances)
    elif data.dataset == "shapes":
        path = Path(data.root) / f"instances_{args.split}.json"
    else:
        raise CaptionerError("evaluate --grounding: give --instances FILE (COCO instances_*.json) for this dataset")
    kind = "shapes" if data.dataset == "shapes" else "coco"
    return GroundingRequest(Instances(path), kind, args.layer, args.head, gradcam=args.saliency == "gradcam")


def outlined_figures(out_dir: Path, records: list[ImageRecord], evaluation: Evaluation) -> None:
    """Heatmap figures of the first images, each scored word's true region outlined in white."""
    from captioner.data.image_files import load_image
    from captioner.evaluation.grounding import word_regions
    from captioner.viz.overlays import save_attention_figure

    assert evaluation.grounding is not None
    request = evaluation.grounding.request
    for record in [r for r in records if r.image_id in evaluation.captions][:FIGURES]:
        caption = evaluation.captions[record.image_id]
        outlines = word_regions(caption, record.image_id, request.instances, request.kind)
        save_attention_figure(out_dir / f"{record.path.stem}_grounding.png", load_image(record.path), caption,
                              layer=request.layer, head=request.head, outlines=outlines)
    log.info("grounding figures (true regions outlined): %s", out_dir)


def print_scores(title: str, scores: Scores, verbose: bool = False) -> None:
    """The metrics and caption statistics; with `verbose` (-v) also the tutorial BLEU and BLEU's factors."""
    print(title)
    for key, value in scores.overall.items():
        print(f"  {key:<8} {value:.4f}")
    beside = scores.beside_official()
    bleu, stats = beside["tutorial_bleu"], beside["caption_stats"]
    print(f"  bad endings {100 * stats['bad_ending_rate']:.1f}%, repeated bigrams "
          f"{100 * stats['repeated_bigram_rate']:.1f}% of captions, mean length {stats['mean_length']:.1f} words")
    if not verbose:
        return
    print(f"  {'nltk_corpus_BLEU_4':<8} {bleu['nltk_corpus_BLEU_4']:.4f}  ({bleu['label']})")
    parts = beside["bleu_parts"]
    print(f"  BLEU's factors: precisions {' / '.join(f'{p:.3f}' for p in parts['precisions'])}, length ratio "
          f"{parts['length_ratio']:.3f} ({parts['hypothesis_words']} words against the closest references' "
          f"{parts['reference_words']}), brevity penalty {parts['brevity_penalty']:.3f}")


def print_grounding(g: dict[str, Any]) -> None:
    """The grounding score beside its uniform baseline, overall and per category, then every map kind."""
    print(f"  grounding {g['score']:.4f} vs uniform {g['uniform_baseline']:.4f} "
          f"({g['ratio']:.1f}x, {g['words']} object words)")
    for name, c in g["per_category"].items():
        ratio = f"{c['ratio']:.1f}x" if c["ratio"] is not None else "n/a"
        print(f"    {name:<14} {c['score']:.4f} vs {c['uniform_baseline']:.4f} ({ratio}, {c['words']} words)")
    table = g["per_head"]  # grounding and pointing-game hit rate of every map kind, beside the baselines
    if not table.get("words"):
        return
    base = table["baselines"]
    print(f"  per map, {table['words']} grounded words: grounding (uniform {base['uniform_grounding']:.4f}), "
          f"pointing game within {table['pointing_tolerance_px']} px (random point {base['random_point']:.4f}, "
          f"centre {base['centre_point']:.4f})")
    for name, scores in table["maps"].items():
        print(f"    {name:<8} grounding {scores['grounding']:.4f}  pointing {scores['pointing']:.4f}")
    if table["best_head"]:
        print(f"  best head (pointing): {table['best_head']}")
