"""Caption metrics: the official COCO evaluation, and a fast in-process subset for validation.
`official_scores` gives pycocoevalcap's numbers (needs Java) in a fraction of its time, checked
against `pycocoevalcap_scores` (its own code); `fast_scores` is BLEU and CIDEr-D without Java.
`nltk_corpus_bleu` is BLEU as the Show-Attend-Tell tutorial reports it, beside the official scores."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captioner.evaluation.java import (
    JavaToolError, check_java, java_environment, java_executable, one_line, quiet_pycocoevalcap, run_java)
from captioner.evaluation.meteor import MeteorPool, cut_table, meteor_arguments, meteor_dir, score_line
from captioner.evaluation.meteor import default_processes as default_meteor_processes
from captioner.evaluation.results_files import Predictions, References, load_references, load_results, scored_ids
from captioner.evaluation.scorers import BleuParts, CountedCaptions, bleu, bleu_parts, cider_d, rouge_l
from captioner.evaluation.spice_models import ensure_spice_models
from captioner.text.vocab import tokenize

logger = logging.getLogger(__name__)

BLEU_KEYS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4")
OFFICIAL_KEYS = (*BLEU_KEYS, "METEOR", "ROUGE_L", "CIDEr")
SPICE_KEY = "SPICE"


def ptb_token_lines(captions: Sequence[str]) -> list[str]:
    """Each caption as pycocoevalcap's PTBTokenizer gives it (tokens joined by spaces, punctuation
    removed), from ONE run of the Java tokenizer, with a time limit and a one-line JavaToolError."""
    from pycocoevalcap.tokenizer import ptbtokenizer

    if not captions:
        return []
    # pycocoevalcap's command: CoreNLP 3.4.1's PTBTokenizer, one caption per line, lower-cased.
    args = ["-cp", ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR, "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines",
            "-lowerCase"]
    # The captions go in on stdin: CoreNLP's PTBTokenizer misreads a file name with a space in it.
    text = "\n".join(one_line(c).replace("\n", " ") for c in captions)
    jar_folder = Path(ptbtokenizer.__file__).resolve().parent
    lines = run_java("PTB tokenizer", args, jar_folder, len(captions), stdin=text).split("\n")
    if len(lines) < len(captions):
        raise JavaToolError(f"PTB tokenizer failed: {len(captions)} captions in, {len(lines)} lines out")
    drop = frozenset(ptbtokenizer.PUNCTUATIONS)
    return [" ".join(w for w in line.rstrip().split(" ") if w not in drop) for line in lines[: len(captions)]]


def ptb_tokenize(captions: list[str]) -> list[list[str]]:
    """Each caption's tokens as the official evaluation scores them: pycocoevalcap's Java PTB
    tokenizer and punctuation removal, run once over all of them. Needs Java."""
    check_java()
    return [line.split() for line in ptb_token_lines(captions)]


@dataclass
class OfficialScores:
    """The official metrics of one set of predictions, with the tokens they were computed on and
    the seconds each stage took (the METEOR stage runs beside BLEU, ROUGE-L and CIDEr-D)."""

    overall: dict[str, float]
    per_image: dict[int, dict[str, float]]
    references: dict[int, list[str]]  # image id -> its references, PTB-tokenised and space-joined
    predictions: dict[int, str]  # image id -> the prediction, PTB-tokenised and space-joined
    seconds: dict[str, float]
    bleu_parts: BleuParts  # BLEU's factors, from the same n-gram counts as the scores


def official_scores(references: Mapping[int, list[str]], predictions: Mapping[int, str], spice: bool = False,
                    meteor_processes: int | None = None) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """(overall, per image) scores of `predictions` as `COCOEvalCap.evaluate` gives them (`score_official`)."""
    scores = score_official(references, predictions, spice=spice, meteor_processes=meteor_processes)
    return scores.overall, scores.per_image


def score_official(references: References, predictions: Predictions, spice: bool = False,
                   meteor_processes: int | None = None) -> OfficialScores:
    """The official COCO caption metrics of the predicted images, equal to pycocoevalcap's: Bleu_1..4,
    METEOR, ROUGE_L, CIDEr (CIDEr-D, scaled 0.6 not 60) and, with `spice`, SPICE's "All" F-score. One
    PTB tokenizer run; METEOR on a cut paraphrase table in a thread beside the in-process scorers."""
    return score_official_many([(references, predictions)], spice=spice, meteor_processes=meteor_processes)[0]


def score_official_many(jobs: Sequence[tuple[References, Predictions]], spice: bool = False,
                        meteor_processes: int | None = None) -> list[OfficialScores]:
    """`score_official` of each (references, predictions) job, with the Java start-ups shared: one PTB
    tokenizer run over every distinct caption and one set of METEOR processes for all the jobs."""
    if not jobs:
        return []
    id_sets = [scored_ids(references, predictions) for references, predictions in jobs]
    logger.debug("java: %s", check_java())
    run_spice = spice and ensure_spice_models()
    processes = meteor_processes or default_meteor_processes(max((len(ids) for ids in id_sets), default=1))
    start = time.perf_counter()
    distinct = list(dict.fromkeys(caption for (references, predictions), ids in zip(jobs, id_sets) for i in ids
                                  for caption in (*references[i], predictions[i])))
    tokens = dict(zip(distinct, ptb_token_lines(distinct)))
    tokenized = [({i: [tokens[c] for c in references[i]] for i in ids}, {i: tokens[predictions[i]] for i in ids})
                 for (references, predictions), ids in zip(jobs, id_sets)]
    tokenizer_seconds = time.perf_counter() - start
    logger.debug("PTB tokenizer: %d jobs, %d distinct captions (%.1f s)", len(jobs), len(distinct), tokenizer_seconds)
    with tempfile.TemporaryDirectory(prefix="captioner-meteor-") as folder:
        lines = [score_line(res[i], gts[i]) for (gts, res), ids in zip(tokenized, id_sets) for i in ids]
        with MeteorPool(processes, cut_table(lines, Path(folder))) as meteor:
            results = [_score_tokenized(meteor, ids, gts, res, {"PTB tokenizer": tokenizer_seconds})
                       for (gts, res), ids in zip(tokenized, id_sets)]
    for scores in results if run_spice else []:
        _add_spice(scores)
    return results


def _score_tokenized(meteor: MeteorPool, ids: list[int], gts: dict[int, list[str]], res: dict[int, str],
                     seconds: dict[str, float]) -> OfficialScores:
    """The official metrics of tokenised captions: METEOR in a thread while BLEU, ROUGE-L and CIDEr-D run here."""
    start_all = time.perf_counter()
    overall: dict[str, float] = {}
    per_image: dict[int, dict[str, float]] = {i: {} for i in ids}
    hypotheses, refs = [res[i] for i in ids], [gts[i] for i in ids]

    def timed_meteor() -> tuple[tuple[float, list[float]], float]:
        start = time.perf_counter()
        return meteor.score(hypotheses, refs), time.perf_counter() - start

    with ThreadPoolExecutor(1) as pool:
        meteor_run = pool.submit(timed_meteor)  # its error, if any, is raised here by result()
        try:
            start = time.perf_counter()
            counted = CountedCaptions.of(hypotheses, refs)
            seconds["n-gram counts"] = time.perf_counter() - start
            for name, keys, scorer in (
                ("BLEU", BLEU_KEYS, lambda: bleu(counted)),
                ("ROUGE-L", ("ROUGE_L",), lambda: _one(rouge_l(hypotheses, refs))),
                ("CIDEr-D", ("CIDEr",), lambda: _one(cider_d(counted))),
            ):
                start = time.perf_counter()
                _record(ids, keys, *scorer(), overall, per_image)
                seconds[name] = time.perf_counter() - start
                logger.debug("%s (%.1f s)", ", ".join(f"{k}: {overall[k]:.3f}" for k in keys), seconds[name])
            meteor_scores, seconds["METEOR"] = meteor_run.result()
        finally:
            if not meteor_run.done():  # this thread failed or was interrupted: stop METEOR too
                meteor.kill()
    _record(ids, ("METEOR",), *_one(meteor_scores), overall, per_image)
    logger.debug("METEOR: %.3f (%d processes, %.1f s beside the others)", overall["METEOR"], len(meteor.tools),
                 seconds["METEOR"])
    overall = {key: overall[key] for key in OFFICIAL_KEYS}  # the official order
    seconds["total"] = seconds["PTB tokenizer"] + time.perf_counter() - start_all
    return OfficialScores(overall, per_image, gts, res, seconds, bleu_parts(counted))


def _add_spice(scores: OfficialScores) -> None:
    """SPICE (its "All" F-score) through pycocoevalcap, after METEOR's processes have ended."""
    from pycocoevalcap.spice.spice import Spice

    start = time.perf_counter()
    with quiet_pycocoevalcap():
        score, image_scores = Spice().compute_score(scores.references, {i: [p] for i, p in scores.predictions.items()})
    scores.overall[SPICE_KEY] = float(score)
    for image_id, image_score in zip(scores.per_image, image_scores):  # SPICE gives every category; keep "All"
        scores.per_image[image_id][SPICE_KEY] = float(image_score["All"]["f"])
    scores.seconds["SPICE"] = time.perf_counter() - start
    scores.seconds["total"] += scores.seconds["SPICE"]


def _one(scores: tuple[float, list[float]]) -> tuple[list[float], list[list[float]]]:
    """A one-metric scorer's (corpus, per image) in the shape of BLEU's (per key)."""
    return [scores[0]], [scores[1]]


def _record(ids: list[int], keys: Sequence[str], corpus: list[float], images: list[list[float]],
            overall: dict[str, float], per_image: dict[int, dict[str, float]]) -> None:
    """Each key's corpus score into `overall` and its per-image scores into `per_image`."""
    for key, value, values in zip(keys, corpus, images):
        overall[key] = float(value)
        for image_id, image_value in zip(ids, values):
            per_image[image_id][key] = float(image_value)


def pycocoevalcap_scores(
    references: Mapping[int, list[str]], predictions: Mapping[int, str]
) -> tuple[dict[str, float], dict[int, dict[str, float]], dict[str, float]]:
    """pycocoevalcap's own tokenizer and scorers run in turn as `COCOEvalCap.evaluate` does (no SPICE):
    the reference for `score_official`. Returns overall, per-image and seconds per stage."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    ids = scored_ids(references, predictions)
    check_java()
    gts = {i: [{"caption": one_line(c)} for c in references[i]] for i in ids}
    res = {i: [{"caption": one_line(predictions[i])}] for i in ids}
    overall: dict[str, float] = {}
    per_image: dict[int, dict[str, float]] = {i: {} for i in ids}
    seconds: dict[str, float] = {}
    start_all = start = time.perf_counter()
    with quiet_pycocoevalcap():
        tokenizer = PTBTokenizer()
        gts_tok, res_tok = tokenizer.tokenize(gts), tokenizer.tokenize(res)
        seconds["PTB tokenizer"] = time.perf_counter() - start
        meteor = None
        try:
            for name, keys, make in (
                ("BLEU", BLEU_KEYS, lambda: Bleu(4)), ("METEOR", ("METEOR",), _pycocoevalcap_meteor),
                ("ROUGE-L", ("ROUGE_L",), Rouge), ("CIDEr-D", ("CIDEr",), Cider),
            ):
                start = time.perf_counter()
                scorer = make()
                meteor = scorer if name == "METEOR" else meteor
                scores = scorer.compute_score(gts_tok, res_tok)
                _record(ids, keys, *(scores if name == "BLEU" else _one(scores)), overall, per_image)
                seconds[name] = time.perf_counter() - start
        finally:
            if meteor is not None:  # stop its Java process now rather than at GC
                with contextlib.suppress(Exception):
                    meteor.meteor_p.stdin.close()
                    meteor.meteor_p.kill()
                    meteor.meteor_p.wait()
                    meteor.meteor_p.stdout.close()
                    meteor.meteor_p.stderr.close()
                # Its __del__ takes its lock, which a failed compute_score never gives back: it would
                # wait for ever in whichever thread collects it.
                meteor.lock = threading.Lock()
    seconds["total"] = time.perf_counter() - start_all
    return overall, per_image, seconds


def _pycocoevalcap_meteor() -> Any:
    """pycocoevalcap's `Meteor`, its scoring untouched, started with its paraphrase table named by
    path, as `MeteorPool` starts METEOR (`meteor_arguments`)."""
    from pycocoevalcap.meteor import meteor

    scorer = meteor.Meteor.__new__(meteor.Meteor)
    scorer.meteor_cmd = [java_executable(), *meteor_arguments()]
    scorer.meteor_p = subprocess.Popen(scorer.meteor_cmd, cwd=meteor_dir(), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=java_environment())
    scorer.lock = threading.Lock()
    return scorer


def fast_scores(references: Mapping[int, list[str]], predictions: Mapping[int, str]) -> dict[str, float]:
    """BLEU-1..4 and CIDEr-D ("CIDEr") in process, without Java: `tokenize` reproduces the PTB
    tokenizer and the scorers are `official_scores`' own. Report `official_scores` in results."""
    ids = scored_ids(references, predictions)
    counted = CountedCaptions.of([" ".join(tokenize(predictions[i])) for i in ids],
                                 [[" ".join(tokenize(c)) for c in references[i]] for i in ids])
    return dict(zip(BLEU_KEYS, map(float, bleu(counted)[0])), CIDEr=cider_d(counted)[0])


def evaluate_results_file(results_path: str | os.PathLike[str], annotations_path: str | os.PathLike[str],
                          spice: bool = False) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """Load a COCO results file and its annotation file and return `official_scores` of it."""
    references = load_references(annotations_path)
    return official_scores(references, load_results(results_path, references), spice=spice)


# nltk's corpus_bleu with no smoothing, on the official scorer's tokens: it matches pycocoevalcap's
# formula but gives ~0 when an n-gram order has no match, so it is never reported as the official score.
TUTORIAL_BLEU_KEYS = tuple(f"nltk_corpus_BLEU_{n}" for n in range(1, 5))
TUTORIAL_BLEU_LABEL = "tutorial-style nltk corpus_bleu, not comparable with COCO-server BLEU"


def nltk_corpus_bleu(references: Mapping[int, list[list[str]]],
                     predictions: Mapping[int, list[str]]) -> dict[str, float]:
    """nltk corpus BLEU-1..4 (uniform weights, no smoothing) of the predicted images, each caption a word list."""
    from nltk.translate.bleu_score import corpus_bleu

    ids = sorted(predictions)
    refs, hyps = [references[i] for i in ids], [predictions[i] for i in ids]
    with warnings.catch_warnings():  # nltk warns when a precision is zero; the score is then ~0
        warnings.simplefilter("ignore")
        return {key: float(corpus_bleu(refs, hyps, weights=(1.0 / n,) * n))
                for n, key in enumerate(TUTORIAL_BLEU_KEYS, start=1)}


def tokenized(references: Mapping[int, list[str]], predictions: Mapping[int, str],
              ptb: bool | None = None) -> tuple[dict[int, list[list[str]]], dict[int, list[str]]]:
    """Word lists of the references and predictions: the Java PTB tokenizer's (`ptb`, as the
    official scorer tokenises) or `tokenize`'s; with `ptb=None` the captions are already tokenised
    and joined by spaces (`OfficialScores` keeps them so)."""
    ids = sorted(predictions)
    if ptb:  # one run of the Java tokenizer over every caption; each caption is tokenised on its own line
        captions = [c for i in ids for c in references[i]] + [predictions[i] for i in ids]
        words = dict(zip(captions, ptb_tokenize(captions))).__getitem__
    else:
        words = str.split if ptb is None else tokenize
    return {i: [words(c) for c in references[i]] for i in ids}, {i: words(predictions[i]) for i in ids}
