"""Statistics of generated captions that the n-gram metrics hide: bad endings and repetition. Think
of self-critical training's captions ending on "with a" (`captioner.text.endings`) or saying "a dog
and a dog"; words come from `tokenize`, so a caption given as text or as words counts alike."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from captioner.evaluation.ngrams import bleu_clip, max_reference_counts
from captioner.text.endings import BAD_ENDINGS
from captioner.text.vocab import tokenize


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


def unmatched_words(
    captions: Mapping[int, str | Sequence[str]], references: Mapping[int, Sequence[str | Sequence[str]]]
) -> tuple[Counter, Counter]:
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
