"""Statistics of generated captions that the n-gram metrics hide: bad endings and repetition. Think
of self-critical training's captions ending on "with a" (`captioner.text.vocab.BAD_ENDINGS`) or saying "a dog
and a dog"; words come from `tokenize`, so a caption given as text or as words counts alike. And the
human ceiling (`leave_one_out`): each reference caption scored against the other references of its
image; as the metrics grow with the number of references, for each fold k the model's caption is
scored against the same references as human caption k, and each metric is the mean over the folds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from captioner.core.errors import CaptionerError
from captioner.evaluation.scorers import bleu_clip, max_reference_counts
from captioner.text.vocab import BAD_ENDINGS, tokenize


def words_of(caption: str | Sequence[str]) -> list[str]:
    return tokenize(caption) if isinstance(caption, str) else [w.lower() for w in caption]


def ends_badly(caption: str | Sequence[str]) -> bool:
    """True when the last word is an article, preposition or conjunction (see BAD_ENDINGS)."""
    words = words_of(caption)
    return bool(words) and words[-1] in BAD_ENDINGS


def repeats_bigram(caption: str | Sequence[str]) -> bool:
    """True when some word bigram occurs twice or more in the caption."""
    words = words_of(caption)
    return any(c > 1 for c in Counter(zip(words, words[1:])).values())


def caption_stats(captions: Iterable[str | Sequence[str]]) -> dict[str, float]:
    """bad_ending_rate, repeated_bigram_rate (shares in [0, 1]) and mean_length (words) of captions."""
    words = [words_of(c) for c in captions]
    n = max(1, len(words))  # no captions: every statistic 0
    return {
        "bad_ending_rate": sum(ends_badly(w) for w in words) / n,
        "repeated_bigram_rate": sum(repeats_bigram(w) for w in words) / n,
        "mean_length": sum(map(len, words)) / n,
    }


def corpus_stats(captions: Sequence[str | Sequence[str]],
                 training_captions: Iterable[str | Sequence[str]]) -> dict[str, float]:
    """`vocabulary` (distinct words), `copied_share` (captions found word for word in `training_captions`),
    `mean_length` and `distinct_share` (distinct captions / captions): a model of a few stock
    sentences scores well on BLEU and poorly here."""
    words = [tuple(words_of(c)) for c in captions]
    seen = {tuple(words_of(c)) for c in training_captions}
    n = max(1, len(words))  # no captions: every statistic 0
    return {
        "captions": len(words),
        "vocabulary": len({w for caption in words for w in caption}),
        "copied_share": sum(caption in seen for caption in words) / n,
        "mean_length": sum(map(len, words)) / n,
        "distinct_share": len(set(words)) / n,
    }


def unmatched_words(captions: Mapping[int, str | Sequence[str]],
                    references: Mapping[int, Sequence[str | Sequence[str]]]) -> tuple[Counter, Counter]:
    """(used, unmatched): per word, how often the captions use it, and how often beyond what the
    image's most generous reference allows (BLEU-1's clipping). 1 - sum(unmatched) / sum(used) is
    BLEU-1's clipped unigram precision; the words with most unmatched uses say why it is low."""
    used: Counter = Counter()
    unmatched: Counter = Counter()
    for image_id, caption in captions.items():
        allowed = max_reference_counts(Counter(words_of(reference)) for reference in references[image_id])
        for word, count in Counter(words_of(caption)).items():
            used[word] += count
            unmatched[word] += count - bleu_clip(count, allowed.get(word, 0))
    return used, unmatched


Job = tuple[Mapping[int, list[str]], Mapping[int, str]]  # (references, predictions)
# Every job's overall scores, in order, from one call: the official scorer then starts Java once
# for all the folds (metrics.score_official_many).
Scorer = Callable[[Sequence[Job]], Sequence[Mapping[str, float]]]


@dataclass(frozen=True)
class LeaveOneOut:
    folds: int  # references held out in turn (the fewest any image has)
    human: dict[str, float]  # mean over folds of reference k against the others
    models: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> mean over the same folds


def leave_one_out(references: Mapping[int, Sequence[str]], score: Scorer,
                  predictions: Mapping[str, Mapping[int, str]] | None = None) -> LeaveOneOut:
    """Score reference k of each image against its other references for every k, and each model in
    `predictions` (name -> image id -> caption) against the same sets, in one call of `score`. Every
    image needs two references and every model's caption, so all rows cover the same images."""
    if not references:
        raise CaptionerError("leave-one-out: no references")
    folds = min(len(refs) for refs in references.values())
    if folds < 2:
        short = next(i for i, refs in references.items() if len(refs) < 2)
        raise CaptionerError(f"leave-one-out: image {short} has {len(references[short])} reference(s); "
                             "each needs at least 2")
    predictions = dict(predictions or {})
    for name, captions in predictions.items():
        missing = references.keys() - captions.keys()
        if missing:
            raise CaptionerError(f"leave-one-out: {name} has no caption for {len(missing)} image(s), "
                                 f"e.g. {min(missing)}")

    names = [None, *predictions]  # per fold: the held-out humans (None), then each model
    jobs: list[Job] = []
    for k in range(folds):
        others = {i: [c for j, c in enumerate(refs) if j != k] for i, refs in references.items()}
        jobs.append((others, {i: refs[k] for i, refs in references.items()}))
        jobs += [(others, {i: captions[i] for i in references}) for captions in predictions.values()]
    totals: dict[str | None, Counter] = {name: Counter() for name in names}  # per name, each key's sum
    for n, scores in enumerate(score(jobs)):
        totals[names[n % len(names)]].update({key: float(value) for key, value in scores.items()})
    means = {name: {key: total / folds for key, total in sums.items()} for name, sums in totals.items()}
    return LeaveOneOut(folds, means.pop(None), means)
