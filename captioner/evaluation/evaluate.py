"""Caption a split with the model's own decoding and score it: the evaluation as a library.
Validation and `captioner evaluate` both caption through `caption_records`, so every number comes
from captions the model wrote itself, never from teacher-forced outputs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from captioner.core.errors import ConfigError, DatasetError
from captioner.core.progress import progress_bar
from captioner.data.batching import image_loader
from captioner.data.records import ImageRecord
from captioner.data.store_format import StoreRows, feature_batches
from captioner.data.store_extract import SplitFeatures
from captioner.evaluation.caption_stats import caption_stats
from captioner.evaluation.scorers import BleuParts, CountedCaptions, bleu_parts
from captioner.evaluation.grounding import (GroundingReport, Instances, InterpretReport, grounding_score,
                                           interpret_scores, records_grad_cam)
from captioner.evaluation.metrics import (
    TUTORIAL_BLEU_LABEL, fast_scores, nltk_corpus_bleu, score_official_many, tokenized)
from captioner.evaluation.results_files import Predictions, References, rounded, scored_ids, write_results
from captioner.core.decode_results import Caption
from captioner.models.captioner import Captioner
from captioner.models.ensemble import Ensemble

logger = logging.getLogger(__name__)


@torch.no_grad()
def caption_records(model: Captioner | Ensemble, records: list[ImageRecord], batch_size: int | None = None,
                    features: torch.Tensor | StoreRows | None = None, grid: tuple[int, int] | None = None,
                    num_workers: int = 0, progress: bool = True, **decode_options: Any) -> dict[int, Caption]:
    """image id -> Caption for every record whose image loads (bad files are logged and skipped).
    With `features` (num_records, N, D) over `grid`, stored encoder outputs are decoded instead of
    the images; `decode_options` go to `Captioner.decode`, those not given keep the model's."""
    refuse_for_ensemble(model, features)
    model.eval()
    batch_size = batch_size or model.decode_config.batch_size
    results: dict[int, Caption] = {}
    with progress_bar(total=len(records), desc="captioning", unit="img", enabled=progress, leave=False) as bar:
        if features is not None:
            if grid is None:
                raise ValueError("caption_records: stored features need their grid (h, w)")
            start = 0
            for feats in feature_batches(features, batch_size, num_workers):
                feats = model.stored_features(feats.to(model.device, non_blocking=True))  # (B, N, D)
                ids = [record.image_id for record in records[start : start + len(feats)]]
                results.update(zip(ids, model.decode(feats, grid, **decode_options)))
                start += len(feats)
                bar.update(len(feats))
        else:
            for images, indices in filter(None, image_loader(records, model.transform, batch_size, num_workers)):
                for i, caption in zip(indices.tolist(), model.caption(images, **decode_options)):
                    results[records[i].image_id] = caption
                bar.update(len(indices))
    return results


@torch.no_grad()
def encode_records(model: Captioner | Ensemble, records: list[ImageRecord], batch_size: int | None = None,
                   num_workers: int = 0, progress: bool = True) -> SplitFeatures:
    """Encode `records`' images once, in memory, to decode them several ways: the loaded records, their
    rows (num_loaded, n, C) on the device as a feature store would hold them, and the grid; an
    ensemble's rows are its packed features (num_loaded, sum N_i*D_i). Works for any encoder."""
    model.eval()
    batch_size = batch_size or model.decode_config.batch_size
    kept: list[ImageRecord] = []
    parts: list[torch.Tensor] = []
    grid: tuple[int, int] | None = None
    with progress_bar(total=len(records), desc="encoding", unit="img", enabled=progress, leave=False) as bar:
        for images, indices in filter(None, image_loader(records, model.transform, batch_size, num_workers)):
            images = images.to(model.device)
            if isinstance(model, Ensemble):
                feats, grid = model.encode(images)  # (B, sum N_i*D_i), packed
            else:
                feats, _ = model.encoder.stored_part(images)  # (B, n, C): caption_records runs the rest
                grid = grid or model.encode(images[:1])[1]  # the attention's grid
            parts.append(feats)
            kept += [records[i] for i in indices.tolist()]
            bar.update(len(indices))
    if grid is None:
        raise DatasetError(f"none of the {len(records)} images could be loaded")
    return SplitFeatures(kept, torch.cat(parts), grid)  # features (num_loaded, N, D)


def refuse_for_ensemble(model: Captioner | Ensemble, features: torch.Tensor | StoreRows | None = None,
                        grounding: GroundingRequest | None = None) -> None:
    """What an ensemble cannot do, as a one-line ConfigError: decode stored features (one encoder's;
    its own packed ones from `encode_records` are fine) or Grad-CAM (one model's gradients)."""
    if not isinstance(model, Ensemble):
        return
    its_own = isinstance(features, torch.Tensor) and features.dim() == 2 and features.shape[1] == model.packed_width
    if features is not None and not its_own:
        raise ConfigError("evaluate: stored features are one encoder's; "
                          "an ensemble encodes the images with each member's encoder")
    if grounding is not None and grounding.gradcam:
        raise ConfigError("evaluate: Grad-CAM follows one model's gradients; an ensemble has several")


def references_for(records: list[ImageRecord], captioned: Mapping[int, Any]) -> References:
    """The reference captions of the captioned images (`captioned`: image id -> Caption or text)."""
    return {r.image_id: list(r.captions) for r in records if r.image_id in captioned}


@dataclass
class Scores:
    """The metrics of one set of captions, and what `evaluate` reports beside them."""

    overall: dict[str, float]
    per_image: dict[int, dict[str, float]]  # image id -> its scores (official metrics only; else empty)
    official: bool  # pycocoevalcap with Java; else the fast in-process BLEU and CIDEr-D
    tutorial_bleu: dict[str, float]  # nltk_corpus_BLEU_1..4 on the same tokens, never the official BLEU
    caption_stats: dict[str, float]  # bad-ending and repeated-bigram rates, mean length
    bleu_parts: BleuParts  # BLEU's factors on the same tokens: precisions, length ratio, brevity penalty

    @property
    def metrics(self) -> str:
        """Which code produced `overall`, in words."""
        return "official (pycocoevalcap)" if self.official else "fast (in-process BLEU, CIDEr-D)"

    def beside_official(self) -> dict[str, dict[str, Any]]:
        """The labelled tutorial-style BLEU and the caption statistics, rounded as the reports show them."""
        return {
            "tutorial_bleu": {"label": TUTORIAL_BLEU_LABEL, **rounded(self.tutorial_bleu)},
            "caption_stats": rounded(self.caption_stats),
            "bleu_parts": {key: [round(p, 4) for p in value] if key == "precisions" else round(value, 4)
                           for key, value in asdict(self.bleu_parts).items()},  # the word counts stay whole
        }


def score_predictions(references: References, predictions: Predictions, official: bool = True,
                      spice: bool = False) -> Scores:
    """Official metrics (Java; SPICE when `spice`) or in-process BLEU and CIDEr-D, with nltk's corpus
    BLEU and the caption statistics beside them on the same tokens."""
    return score_predictions_many([(references, predictions)], official, spice)[0]


def score_predictions_many(jobs: Sequence[tuple[References, Predictions]], official: bool = True,
                           spice: bool = False) -> list[Scores]:
    """`score_predictions` of each (references, predictions) job, in order; the official scorer
    starts its Java tools once for all of them (`score_official_many`)."""
    if official:
        return [_scores(run.overall, run.per_image, True, *tokenized(run.references, run.predictions), run.bleu_parts)
                for run in score_official_many(jobs, spice=spice)]
    scored = []
    for references, predictions in jobs:
        ids = scored_ids(references, predictions)  # before any lookup: a missing image is one DatasetError
        refs, preds = tokenized(references, predictions, ptb=False)
        parts = bleu_parts(CountedCaptions.of([" ".join(preds[i]) for i in ids],
                                              [[" ".join(r) for r in refs[i]] for i in ids]))
        scored.append(_scores(fast_scores(references, predictions), {}, False, refs, preds, parts))
    return scored


def _scores(overall: dict[str, float], per_image: dict[int, dict[str, float]], official: bool,
            refs: dict[int, list[list[str]]], preds: dict[int, list[str]], parts: BleuParts) -> Scores:
    """The scores with nltk's corpus BLEU and the caption statistics on the tokens they saw."""
    return Scores(overall, per_image, official, nltk_corpus_bleu(refs, preds), caption_stats(preds.values()), parts)


@dataclass
class DecodedVariant:
    """One decoding setting's captions of a split, their scores, and the seconds decoding took."""

    name: str
    captions: dict[int, Caption]
    scores: Scores
    seconds: float


def decode_variants(model: Captioner | Ensemble, encoded: SplitFeatures, variants: Mapping[str, Mapping[str, Any]],
                    batch_size: int | None = None, official: bool = True) -> Iterator[DecodedVariant]:
    """Caption the `encode_records` images with each of `variants` (name -> decoding options), then
    score them all in one `score_predictions_many` (one start of the Java tools)."""
    decoded: list[tuple[str, dict[int, Caption], float]] = []
    for name, options in variants.items():
        start = time.perf_counter()
        captions = caption_records(model, encoded.records, batch_size, features=encoded.features, grid=encoded.grid,
                                   progress=False, **options)
        decoded.append((name, captions, time.perf_counter() - start))
        logger.info("decoded %d images with %s (%.1f s)", len(captions), name, decoded[-1][2])
    jobs = [(references_for(encoded.records, captions), {i: c.text for i, c in captions.items()})
            for _, captions, _ in decoded]
    for (name, captions, seconds), scores in zip(decoded, score_predictions_many(jobs, official=official)):
        yield DecodedVariant(name, captions, scores, seconds)


@dataclass(frozen=True)
class GroundingRequest:
    """What to score the attention maps against, and which maps."""

    instances: Instances  # the instance masks of the images
    kind: str = "shapes"  # how words name objects: "shapes" (colour, shape words) or "coco" (categories)
    layer: int = -1  # decoder layer of the scored maps (transformer)
    head: int | None = None  # attention head; None: the mean over heads
    gradcam: bool = False  # also score each grounded word's Grad-CAM (one gradient pass per caption)


@dataclass
class Grounding:
    """The grounding score of the requested maps, and grounding and pointing of every map kind."""

    request: GroundingRequest
    attention: GroundingReport
    per_map: InterpretReport

    def to_json(self) -> dict[str, Any]:
        return {"instances": str(self.request.instances.path), "layer": self.request.layer,
                "head": "mean" if self.request.head is None else self.request.head,
                **self.attention.to_json(), "per_head": self.per_map.to_json()}


def score_grounding(model: Captioner | Ensemble, records: list[ImageRecord], captions: dict[int, Caption],
                    request: GroundingRequest, batch_size: int | None = None) -> Grounding:
    """Score the attention of every object word of `captions` against the instance masks; with
    `request.gradcam` the images of `records` are encoded again for Grad-CAM."""
    refuse_for_ensemble(model, grounding=request)
    attention = grounding_score(captions, request.instances, request.kind, layer=request.layer, head=request.head)
    saliency = (records_grad_cam(model, records, captions, request.instances, request.kind,
                                 batch_size or model.decode_config.batch_size) if request.gradcam else None)
    return Grounding(request, attention, interpret_scores(captions, request.instances, request.kind, saliency))


@dataclass
class Evaluation:
    """A model's captions of a split, their scores and, when asked, their grounding."""

    captions: dict[int, Caption]  # image id -> the model's caption, for every image that loaded
    references: References  # of the captioned images
    scores: Scores
    grounding: Grounding | None = None

    @property
    def predictions(self) -> Predictions:
        return {image_id: caption.text for image_id, caption in self.captions.items()}


def evaluate(model: Captioner | Ensemble, records: list[ImageRecord], *, official: bool = True, spice: bool = False,
             grounding: GroundingRequest | None = None, results_file: str | Path | None = None,
             batch_size: int | None = None, features: torch.Tensor | StoreRows | None = None,
             grid: tuple[int, int] | None = None, num_workers: int = 0, progress: bool = True,
             **decode_options: Any) -> Evaluation:
    """Caption `records` (or their stored `features` over `grid`, row i for record i), score the captions
    and, with `grounding`, their attention. `results_file` gets the captions in COCO's results format
    before scoring, so a scorer that fails loses none of them."""
    refuse_for_ensemble(model, features, grounding)  # before captioning
    captions = caption_records(model, records, batch_size, features, grid, num_workers, progress, **decode_options)
    predictions = {image_id: caption.text for image_id, caption in captions.items()}
    if results_file is not None:
        write_results(results_file, predictions)
    references = references_for(records, captions)
    scores = score_predictions(references, predictions, official=official, spice=spice)
    grounded = None if grounding is None else score_grounding(model, records, captions, grounding, batch_size)
    return Evaluation(captions, references, scores, grounded)
