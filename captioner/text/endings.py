"""The words a caption must not end on: articles, prepositions and conjunctions ("a man riding
a", "a dog with"). Evaluation counts the captions that do (`evaluation.caption_stats`) and
decoding can forbid them (`<eos>` is not allowed right after one); both read these lists.

Words that end English captions legitimately as adverbs or particles ("looking up", "lying
down", "standing outside", "walking by", "flying over") are left out, so the rule catches
captions cut off mid-phrase, not style.
"""

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
