"""Caption metrics: the official COCO evaluation, and a fast in-process subset for validation.

`official_scores` runs pycocoevalcap's own scorers exactly as its `COCOEvalCap` does (Java PTB
tokenizer, BLEU-1..4, METEOR, ROUGE-L, CIDEr-D and optionally SPICE), so the numbers are the ones
papers and the COCO server report. It needs a Java runtime (`captioner.evaluation.java`).
`fast_scores` computes BLEU and CIDEr-D in process with the pure-Python tokenizer of
`captioner.text.vocab`, for training-time validation where starting Java for every epoch would
cost more than the scoring.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from captioner.core.errors import CaptionerError
from captioner.evaluation.java import (
    check_java,
    ensure_spice_models,
    one_line,
    quiet_pycocoevalcap,
)
from captioner.evaluation.results_files import load_references, load_results, scored_ids
from captioner.text.vocab import tokenize

logger = logging.getLogger(__name__)

BLEU_KEYS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4")
OFFICIAL_KEYS = (*BLEU_KEYS, "METEOR", "ROUGE_L", "CIDEr")
SPICE_KEY = "SPICE"


def ptb_tokenize(captions: list[str]) -> list[list[str]]:
    """Each caption's tokens as the official evaluation scores them: pycocoevalcap's Java PTB
    tokenizer and punctuation removal, run once over all of them. Needs Java."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    check_java()
    with quiet_pycocoevalcap():
        out = PTBTokenizer().tokenize({i: [{"caption": one_line(c)}] for i, c in enumerate(captions)})
    if len(out) != len(captions):
        raise CaptionerError("the Java PTB tokenizer returned the wrong number of captions (see the DEBUG log)")
    return [out[i][0].split() for i in range(len(captions))]


def official_scores(
    references: Mapping[int, list[str]], predictions: Mapping[int, str], spice: bool = False
) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """Score `predictions` with pycocoevalcap exactly as its `COCOEvalCap.evaluate` does.

    Only the predicted images are scored (as in the official demo, `params['image_id'] =
    cocoRes.getImgIds()`), each against all its references. Returns the overall scores and the
    per-image scores, keyed Bleu_1..Bleu_4, METEOR, ROUGE_L, CIDEr and, when `spice` is true and
    SPICE's CoreNLP models are installed (or can be downloaded), SPICE (its "All" F-score).

    "CIDEr" is pycocoevalcap's CIDEr, which is the CIDEr-D variant (clipped n-gram counts, length
    penalty, sigma 6) that the COCO evaluation server reports, scaled like it (so 0.6, not 60).

    Needs Java 8+ on PATH (PTB tokenizer, METEOR, SPICE); raises CaptionerError without it.
    """
    ids = scored_ids(references, predictions)
    java = check_java()
    logger.debug("java: %s", java)
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    run_spice = spice and ensure_spice_models()
    # COCOEvalCap hands the tokenizer the annotation dicts; only "caption" is read.
    gts = {i: [{"caption": one_line(c)} for c in references[i]] for i in ids}
    res = {i: [{"caption": one_line(predictions[i])}] for i in ids}

    overall: dict[str, float] = {}
    per_image: dict[int, dict[str, float]] = {i: {} for i in ids}
    with quiet_pycocoevalcap():
        start = time.perf_counter()
        tokenizer = PTBTokenizer()
        gts_tok, res_tok = tokenizer.tokenize(gts), tokenizer.tokenize(res)
        for name, tokenized, source in (("references", gts_tok, gts), ("predictions", res_tok, res)):
            if [len(tokenized.get(i, ())) for i in ids] != [len(source[i]) for i in ids]:
                raise CaptionerError(f"the Java PTB tokenizer returned the wrong number of {name} (see the DEBUG log)")
        logger.info(
            "PTB tokenizer: %d images, %d references (%.1f s)",
            len(ids), sum(map(len, gts.values())), time.perf_counter() - start,
        )

        scorers: list[tuple[Any, str | tuple[str, ...]]] = [
            (Bleu(4), BLEU_KEYS), (Meteor(), "METEOR"), (Rouge(), "ROUGE_L"), (Cider(), "CIDEr")
        ]
        if run_spice:
            from pycocoevalcap.spice.spice import Spice

            scorers.append((Spice(), SPICE_KEY))
        try:
            for scorer, method in scorers:
                start = time.perf_counter()
                score, scores = scorer.compute_score(gts_tok, res_tok)
                names, values, image_values = (
                    (method, score, scores) if isinstance(method, tuple) else ((method,), [score], [scores])
                )
                for key, value, values_per_image in zip(names, values, image_values):
                    overall[key] = float(value)
                    for image_id, image_score in zip(ids, values_per_image):
                        if key == SPICE_KEY:  # per image SPICE gives every category; keep "All"
                            image_score = image_score["All"]["f"]
                        per_image[image_id][key] = float(image_score)
                logger.info(
                    "%s (%.1f s)", ", ".join(f"{k}: {overall[k]:.3f}" for k in names), time.perf_counter() - start
                )
        finally:
            for scorer, _ in scorers:
                if isinstance(scorer, Meteor):  # stop its Java process now rather than at GC
                    with contextlib.suppress(Exception):
                        scorer.meteor_p.stdin.close()
                        scorer.meteor_p.kill()
                        scorer.meteor_p.wait()
    return overall, per_image


def fast_scores(references: Mapping[int, list[str]], predictions: Mapping[int, str]) -> dict[str, float]:
    """BLEU-1..4 and CIDEr-D ("CIDEr") of `predictions`, in process and without Java.

    Tokenised with `captioner.text.tokenizer.tokenize` (which reproduces the PTB tokenizer and its
    punctuation removal) and scored by pycocoevalcap's own pure-Python Bleu and Cider, so the
    numbers match `official_scores`. For validation during training; report `official_scores` in results.
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider

    ids = scored_ids(references, predictions)
    gts = {i: [" ".join(tokenize(c)) for c in references[i]] for i in ids}
    res = {i: [" ".join(tokenize(predictions[i]))] for i in ids}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    scores = {key: float(value) for key, value in zip(BLEU_KEYS, bleu)}
    scores["CIDEr"] = float(cider)
    return scores


def evaluate_results_file(
    results_path: str | os.PathLike[str], annotations_path: str | os.PathLike[str], spice: bool = False
) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """Load a COCO results file and its annotation file and return `official_scores` of it."""
    references = load_references(annotations_path)
    predictions = load_results(results_path, references)
    return official_scores(references, predictions, spice=spice)
