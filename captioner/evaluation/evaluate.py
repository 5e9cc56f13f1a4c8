"""Caption a split with the model's own decoding and score it; write COCO-format results.

Validation during training and the final evaluation both call `caption_records`, so the
numbers always come from captions the model wrote itself, never from teacher-forced outputs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from tqdm import tqdm

from captioner.core.errors import CaptionerError
from captioner.data.batching import image_loader
from captioner.data.records import ImageRecord
from captioner.data.store import StoreRows, feature_batches
from captioner.evaluation.caption_stats import caption_stats
from captioner.evaluation.metrics import (
    fast_scores,
    load_references,
    load_results,
    official_scores,
    write_scores_json,
)
from captioner.evaluation.tutorial_bleu import LABEL as TUTORIAL_LABEL
from captioner.evaluation.tutorial_bleu import nltk_corpus_bleu, tokenized
from captioner.models.caption import Caption
from captioner.models.captioner import Captioner

log = logging.getLogger(__name__)

DEFAULT_EVAL_DIR = "runs/eval"  # `evaluate --results` without --out writes its scores here


@torch.no_grad()
def caption_records(
    model: Captioner,
    records: list[ImageRecord],
    beam_size: int | None = None,
    max_length: int | None = None,
    batch_size: int | None = None,
    features: torch.Tensor | StoreRows | None = None,
    grid: tuple[int, int] | None = None,
    num_workers: int = 0,
    progress: bool = True,
    **decode_options,
) -> dict[int, Caption]:
    """image id -> Caption for every record whose image loads (bad files are logged and skipped).

    With `features` (num_records, N, D) and their `grid`, stored encoder outputs (rows of the
    feature store, read by `num_workers` DataLoader workers, or a tensor in memory or on the
    device) are decoded instead of the images. Other `decode_options` (trigram blocking, diverse
    beam search) go to `Captioner.decode`.
    """
    model.eval()
    batch_size = batch_size or model.decode_config.batch_size
    options = {"beam_size": beam_size, "max_length": max_length, **decode_options}
    results: dict[int, Caption] = {}
    bar = tqdm(total=len(records), desc="captioning", unit="img", disable=not progress, leave=False)
    if features is not None:
        assert grid is not None
        start = 0
        for feats in feature_batches(features, batch_size, num_workers):
            feats = model.stored_features(feats.to(model.device, non_blocking=True))  # (B, N, D)
            for record, caption in zip(records[start : start + len(feats)], model.decode(feats, grid, **options)):
                results[record.image_id] = caption
            start += len(feats)
            bar.update(len(feats))
    else:
        for batch in image_loader(records, model.transform, batch_size, num_workers):
            if batch is None:
                continue
            images, indices = batch
            for i, caption in zip(indices.tolist(), model.caption_images(images, **options)):
                results[records[i].image_id] = caption
            bar.update(len(indices))
    bar.close()
    return results


def references_for(records: list[ImageRecord], captions: dict[int, Caption]) -> dict[int, list[str]]:
    """The reference captions of the images that were captioned (bad files were skipped)."""
    return {r.image_id: list(r.captions) for r in records if r.image_id in captions}


def write_results(path: str | Path, captions: dict[int, Caption]) -> Path:
    """The standard COCO results format: [{"image_id": int, "caption": str}, ...]."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"image_id": image_id, "caption": c.text} for image_id, c in sorted(captions.items())]
    path.write_text(json.dumps(rows, indent=1))
    return path


def score_captions(records: list[ImageRecord], captions: dict[int, Caption]) -> dict[str, float]:
    """Fast in-process BLEU-1..4 and CIDEr-D (pycocoevalcap's scorers, no Java) on the captioned images."""
    return fast_scores(references_for(records, captions), {i: c.text for i, c in captions.items()})


def run_evaluation(args) -> dict:
    """`captioner evaluate`: a checkpoint on a split, or a results file against annotations.

    Scores come from the official COCO caption code (pycocoevalcap, Java) unless `--fast`
    asks for the in-process BLEU/CIDEr-D used during training. Writes the COCO-format results
    and a JSON of overall and per-image scores (and the grounding score with `--grounding`).
    """
    if args.results or args.annotations:
        if not (args.results and args.annotations):
            raise CaptionerError("evaluate: --results and --annotations go together")
        if args.grounding:
            raise CaptionerError("evaluate: --grounding needs a CHECKPOINT (attention maps), not a results file")
        references = load_references(args.annotations)
        predictions = load_results(args.results, references)
        if args.fast:
            overall, per_image = fast_scores({i: references[i] for i in predictions}, predictions), {}
        else:
            overall, per_image = official_scores(references, predictions, spice=args.spice)
        report = {"results": str(args.results), "annotations": str(args.annotations), "images": len(per_image) or None}
        report.update(beside_official(references, predictions, args.fast))
        # Never beside the results file: its folder may be read-only or shared data.
        out = Path(args.out) if args.out else Path(DEFAULT_EVAL_DIR) / f"{Path(args.results).stem}_scores.json"
        out = out / "scores.json" if out.suffix != ".json" else out
        out.parent.mkdir(parents=True, exist_ok=True)
        write_scores_json(out, overall, per_image, extra=report)
        _print_scores(f"{args.results} against {args.annotations}", overall, args.json)
        _print_beside_official(report, args.json)
        if not args.json:
            print(f"scores: {out}")
        return {**report, "scores": _rounded(overall), "scores_file": str(out)}

    if not args.checkpoint:
        raise CaptionerError("evaluate: give a CHECKPOINT, or --results FILE --annotations FILE")
    if getattr(args, "saliency", None) and not args.grounding:
        raise CaptionerError("evaluate: --saliency scores saliency maps against instance masks; it needs --grounding")
    from captioner.core.runtime import resolve_device
    from captioner.data.datasets import load_split
    from captioner.models.checkpoint import checkpoint_config, load_captioner

    model = load_captioner(args.checkpoint, resolve_device(args.device))
    data = checkpoint_config(args.checkpoint).data  # the dataset the model was trained on
    records = all_records = load_split(data, args.split)
    if args.limit:
        records = records[: args.limit]
    from captioner.apps.arguments import decode_options

    options = {**decode_options(args), "beam_size": args.beam or model.decode_config.beam_size}
    beam = options["beam_size"]
    if args.features:  # the frozen encoder's stored grids instead of the images
        from captioner.data.store import split_features

        config = checkpoint_config(args.checkpoint)
        config.data.feature_store = args.features
        stored = split_features(model, config, args.split, all_records, use=records)
        captions = caption_records(
            model, stored.records, batch_size=args.batch_size, features=stored.features, grid=stored.grid,
            num_workers=config.data.num_workers, **options,
        )
    else:
        captions = caption_records(model, records, batch_size=args.batch_size, **options)
    out_dir = Path(args.out) if args.out else Path(args.checkpoint).parent
    results_path = write_results(out_dir / f"results_{args.split}.json", captions)
    references = references_for(records, captions)
    predictions = {i: c.text for i, c in captions.items()}
    if args.fast:
        overall, per_image, metrics = fast_scores(references, predictions), {}, "fast (in-process BLEU, CIDEr-D)"
    else:
        overall, per_image = official_scores(references, predictions, spice=args.spice)
        metrics = "official (pycocoevalcap)"
    report = {
        "checkpoint": str(args.checkpoint),
        "split": args.split,
        "images": len(captions),
        "beam_size": beam,
        "decode": {k: v for k, v in options.items() if v is not None},
        "metrics": metrics,
        "results": str(results_path),
    }
    report.update(beside_official(references, predictions, args.fast))
    if args.grounding:
        report["grounding"] = _grounding(model, records, captions, args)
    write_scores_json(out_dir / f"scores_{args.split}.json", overall, per_image, extra=report)
    if not args.json:
        _print_scores(f"{args.checkpoint} on {args.split} ({len(captions)} images, beam {beam}, {metrics})", overall, False)
        _print_beside_official(report, False)
        if "grounding" in report:
            g = report["grounding"]
            print(f"  grounding {g['score']:.4f} vs uniform {g['uniform_baseline']:.4f} "
                  f"({g['ratio']:.1f}x, {g['words']} object words)")
            for name, c in g["per_category"].items():
                ratio = f"{c['ratio']:.1f}x" if c["ratio"] is not None else "n/a"
                print(f"    {name:<14} {c['score']:.4f} vs {c['uniform_baseline']:.4f} ({ratio}, {c['words']} words)")
            _print_per_head(g["per_head"])
        for record in records[:3]:
            if record.image_id in captions:
                print(f"  e.g. {record.path.name}: {captions[record.image_id].text!r}")
        print(f"results: {results_path}")
    return {**report, "scores": _rounded(overall)}


def _print_per_head(table: dict) -> None:
    """Grounding and pointing-game hit rate of every map kind, beside the baselines."""
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


def beside_official(references: dict[int, list[str]], predictions: dict[int, str], fast: bool) -> dict:
    """What `evaluate` reports next to the official scores: the tutorial-style nltk BLEU on the
    same tokens (the PTB tokenizer's, or `vocab.tokenize`'s with --fast) and the caption
    statistics (bad-ending and repeated-bigram rates)."""
    refs, preds = tokenized(references, predictions, ptb=not fast)
    bleu = nltk_corpus_bleu(refs, preds)
    return {
        "tutorial_bleu": {"label": TUTORIAL_LABEL, **_rounded(bleu)},
        "caption_stats": _rounded(caption_stats(preds.values())),
    }


def _print_beside_official(report: dict, quiet: bool) -> None:
    if quiet:
        return
    bleu, stats = report["tutorial_bleu"], report["caption_stats"]
    print(f"  {'nltk_corpus_BLEU_4':<8} {bleu['nltk_corpus_BLEU_4']:.4f}  ({bleu['label']})")
    print(f"  bad endings {100 * stats['bad_ending_rate']:.1f}%, repeated bigrams "
          f"{100 * stats['repeated_bigram_rate']:.1f}% of captions, mean length {stats['mean_length']:.1f} words")


def _grounding(model: Captioner, records: list[ImageRecord], captions: dict[int, Caption], args) -> dict:
    from captioner.evaluation.grounding import Instances, grounding_score
    from captioner.evaluation.interpret import interpret_scores, records_grad_cam
    from captioner.models.checkpoint import checkpoint_config

    data = checkpoint_config(args.checkpoint).data
    kind = "shapes" if data.dataset == "shapes" else "coco"  # how words name objects: the model's world decides
    if args.instances:
        path = Path(args.instances)
    elif data.dataset == "shapes":
        path = Path(data.root) / f"instances_{args.split}.json"
    else:
        raise CaptionerError("evaluate --grounding: give --instances FILE (COCO instances_*.json) for this dataset")
    instances = Instances(path)
    report = grounding_score(captions, instances, kind, layer=args.layer, head=args.head)
    if args.heatmaps:
        _outlined_figures(Path(args.heatmaps), records, captions, instances, kind, args)
    saliency = None
    if getattr(args, "saliency", None) == "gradcam":
        saliency = records_grad_cam(model, records, captions, instances, kind, args.batch_size or model.decode_config.batch_size)
    heads = interpret_scores(captions, instances, kind, saliency)
    return {
        "instances": str(path), "layer": args.layer, "head": "mean" if args.head is None else args.head,
        **report.to_json(), "per_head": heads.to_json(),
    }


def _outlined_figures(
    out_dir: Path, records: list[ImageRecord], captions: dict[int, Caption], instances, kind: str, args, count: int = 8
) -> None:
    """Heatmap figures of the first images, each scored word's true region outlined in white."""
    from captioner.data.images import load_image
    from captioner.evaluation.grounding import word_regions
    from captioner.viz.overlays import save_attention_figure

    for record in [r for r in records if r.image_id in captions][:count]:
        caption = captions[record.image_id]
        outlines = word_regions(caption, record.image_id, instances, kind)
        save_attention_figure(
            out_dir / f"{record.path.stem}_grounding.png", load_image(record.path), caption,
            layer=args.layer, head=args.head, outlines=outlines,
        )
    log.info("grounding figures (true regions outlined): %s", out_dir)


def _rounded(scores: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in scores.items()}


def _print_scores(title: str, scores: dict[str, float], quiet: bool) -> None:
    if quiet:
        return
    print(title)
    for key, value in scores.items():
        print(f"  {key:<8} {value:.4f}")
