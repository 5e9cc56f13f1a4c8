"""The human ceiling: each reference caption scored against the other references of its image.
The metrics grow with the number of references, so for each fold k the model's caption is scored
against the same references as human caption k, and each metric is the mean over the folds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from captioner.core.errors import CaptionerError

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
