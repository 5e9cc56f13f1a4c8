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

from captioner.data.batching import image_loader
from captioner.data.records import ImageRecord
from captioner.models import Caption, Captioner

log = logging.getLogger(__name__)


@torch.no_grad()
def caption_records(
    model: Captioner,
    records: list[ImageRecord],
    beam_size: int | None = None,
    max_length: int | None = None,
    batch_size: int | None = None,
    features: torch.Tensor | None = None,
    grid: tuple[int, int] | None = None,
    num_workers: int = 0,
    progress: bool = True,
) -> dict[int, Caption]:
    """image id -> Caption for every record whose image loads (bad files are logged and skipped).

    With `features` (num_records, N, D) and their `grid`, cached encoder outputs are decoded
    instead of the images.
    """
    model.eval()
    batch_size = batch_size or model.config.decode.batch_size
    options = {"beam_size": beam_size, "max_length": max_length}
    results: dict[int, Caption] = {}
    bar = tqdm(total=len(records), desc="captioning", unit="img", disable=not progress, leave=False)
    if features is not None:
        assert grid is not None
        for start in range(0, len(records), batch_size):
            feats = features[start : start + batch_size].to(model.device)  # (B, N, D)
            if model.config.model.blind:
                feats = torch.zeros_like(feats)
            for record, caption in zip(records[start : start + batch_size], model.decode(feats, grid, **options)):
                results[record.image_id] = caption
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


def references_of(records: list[ImageRecord]) -> dict[int, list[str]]:
    return {r.image_id: list(r.captions) for r in records}


def write_results(path: str | Path, captions: dict[int, Caption]) -> Path:
    """The standard COCO results format: [{"image_id": int, "caption": str}, ...]."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"image_id": image_id, "caption": c.text} for image_id, c in sorted(captions.items())]
    path.write_text(json.dumps(rows, indent=1))
    return path


def score_captions(records: list[ImageRecord], captions: dict[int, Caption]) -> dict[str, float]:
    """Fast in-process BLEU-1..4 and CIDEr-D (pycocoevalcap's scorers, no Java) on the captioned images."""
    from captioner.metrics import fast_scores

    references = {r.image_id: list(r.captions) for r in records if r.image_id in captions}
    return fast_scores(references, {i: c.text for i, c in captions.items()})


def run_evaluation(args) -> dict:
    """`captioner evaluate CHECKPOINT --split S`: caption the split, score, write results and scores."""
    from captioner.checkpoint import load_captioner
    from captioner.data import load_split
    from captioner.errors import CaptionerError
    from captioner.train import resolve_device

    if not args.checkpoint:
        raise CaptionerError("evaluate: give a CHECKPOINT (or --results FILE --annotations FILE)")
    model = load_captioner(args.checkpoint, resolve_device(args.device))
    records = load_split(model.config.data, args.split)
    if args.limit:
        records = records[: args.limit]
    beam = args.beam or model.config.decode.beam_size
    captions = caption_records(model, records, beam_size=beam, max_length=args.max_length, batch_size=args.batch_size)
    out_dir = Path(args.out) if args.out else Path(args.checkpoint).parent
    results_path = write_results(out_dir / f"results_{args.split}.json", captions)
    scores = score_captions(records, captions)
    report = {
        "checkpoint": str(args.checkpoint),
        "split": args.split,
        "images": len(captions),
        "beam_size": beam,
        "scores": {k: round(v, 4) for k, v in scores.items()},
        "results": str(results_path),
    }
    (out_dir / f"scores_{args.split}.json").write_text(json.dumps(report, indent=1))
    if not args.json:
        print(f"{args.checkpoint} on {args.split} ({len(captions)} images, beam {beam})")
        for key, value in scores.items():
            print(f"  {key:<8} {value:.4f}")
        for record in records[:3]:
            if record.image_id in captions:
                print(f"  e.g. {record.path.name}: {captions[record.image_id].text!r}")
        print(f"results: {results_path}")
    return report
