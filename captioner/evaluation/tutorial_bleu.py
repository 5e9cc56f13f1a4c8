"""BLEU as the Show-Attend-Tell tutorial reports it: nltk's `corpus_bleu`, beside the official scores.
No smoothing, on the official scorer's tokens, reported as `nltk_corpus_BLEU_n`, never as the
official score: it matches pycocoevalcap's formula but gives ~0 when an n-gram order has no match."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from captioner.evaluation.metrics import ptb_tokenize
from captioner.text.vocab import tokenize

KEYS = tuple(f"nltk_corpus_BLEU_{n}" for n in range(1, 5))
LABEL = "tutorial-style nltk corpus_bleu, not comparable with COCO-server BLEU"


def nltk_corpus_bleu(references: Mapping[int, list[list[str]]],
                     predictions: Mapping[int, list[str]]) -> dict[str, float]:
    """nltk corpus BLEU-1..4 (uniform weights, no smoothing) of the predicted images, each caption a word list."""
    from nltk.translate.bleu_score import corpus_bleu

    ids = sorted(predictions)
    refs = [references[i] for i in ids]
    hyps = [predictions[i] for i in ids]
    scores = {}
    with warnings.catch_warnings():  # nltk warns when a precision is zero; the score is then ~0
        warnings.simplefilter("ignore")
        for n, key in enumerate(KEYS, start=1):
            scores[key] = float(corpus_bleu(refs, hyps, weights=(1.0 / n,) * n))
    return scores


def tokenized(
    references: Mapping[int, list[str]], predictions: Mapping[int, str], ptb: bool | None = None
) -> tuple[dict[int, list[list[str]]], dict[int, list[str]]]:
    """Word lists of the references and predictions: the Java PTB tokenizer's (`ptb`, as the
    official scorer tokenises) or `captioner.text.vocab.tokenize`'s; with `ptb=None` the captions
    are already tokenised and joined by spaces (`metrics.OfficialScores` keeps them so)."""
    ids = sorted(predictions)
    if ptb is None:
        return {i: [c.split() for c in references[i]] for i in ids}, {i: predictions[i].split() for i in ids}
    if not ptb:
        return {i: [tokenize(c) for c in references[i]] for i in ids}, {i: tokenize(predictions[i]) for i in ids}
    # One run of the Java tokenizer over every caption; each caption is tokenised on its own line.
    captions = [c for i in ids for c in references[i]] + [predictions[i] for i in ids]
    tokens = iter(ptb_tokenize(captions))
    refs = {i: [next(tokens) for _ in references[i]] for i in ids}
    return refs, {i: next(tokens) for i in ids}
