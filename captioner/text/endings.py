"""The words a caption must not end on: articles, prepositions and conjunctions ("a dog with"). Evaluation counts
them and decoding can forbid `<eos>` after one; adverbs and particles ("looking up") are left out."""

from __future__ import annotations

from collections.abc import Mapping

ARTICLES = frozenset({"a", "an", "the"})
PREPOSITIONS = frozenset({
    "of", "in", "on", "at", "to", "for", "with", "from", "into", "onto", "near", "under", "beneath",
    "between", "among", "across", "through", "toward", "towards", "against", "upon", "beside", "during",
    "without", "within", "like", "atop",
})
CONJUNCTIONS = frozenset({"and", "or", "but", "nor", "while", "because", "as", "if", "than", "whereas"})
BAD_ENDINGS = ARTICLES | PREPOSITIONS | CONJUNCTIONS


def bad_ending_ids(index: Mapping[str, int]) -> tuple[int, ...]:
    """The ids of a vocabulary's words in BAD_ENDINGS (`index`: word -> id, `Vocabulary.index`), in order."""
    return tuple(sorted(index[word] for word in BAD_ENDINGS if word in index))
