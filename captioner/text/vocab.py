"""Tokenisation, the word vocabulary and the words a caption must not end on. `tokenize`
(`captioner.text.tokenizer`) gives the words COCO scores. The bad endings are articles, prepositions and
conjunctions ("a dog with"): evaluation counts them and decoding can forbid `<eos>` after one; adverbs and
particles ("looking up") are left out."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from captioner.core.bounded_files import MODEL_JSON_BYTES, read_json
from captioner.core.errors import ConfigError, DatasetError
from captioner.core.files import write_atomically
from captioner.core.model_spec import check_words
from captioner.text.tokenizer import tokenize

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)

# The words a caption must not end on (`bad_ending_ids`).
ARTICLES = frozenset({"a", "an", "the"})
PREPOSITIONS = frozenset({
    "of", "in", "on", "at", "to", "for", "with", "from", "into", "onto", "near", "under", "beneath",
    "between", "among", "across", "through", "toward", "towards", "against", "upon", "beside", "during",
    "without", "within", "like", "atop",
})
CONJUNCTIONS = frozenset({"and", "or", "but", "nor", "while", "because", "as", "if", "than", "whereas"})
BAD_ENDINGS = ARTICLES | PREPOSITIONS | CONJUNCTIONS


class Vocabulary:
    """A word <-> id mapping with `<pad>`=0, `<bos>`, `<eos>`, `<unk>` first."""

    def __init__(self, words: Sequence[str]) -> None:
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise DatasetError(f"vocabulary must start with {', '.join(SPECIALS)}")
        if len(set(words)) != len(words):
            raise DatasetError("vocabulary has duplicate words")
        self.words = list(words)
        self.index = {word: i for i, word in enumerate(self.words)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (self.index[s] for s in SPECIALS)

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 1) -> Vocabulary:
        """Keep the words seen at least `min_count` times, most frequent first (ties by word)."""
        counts = Counter(token for caption in captions for token in tokenize(caption))
        kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls([*SPECIALS, *kept])

    def __len__(self) -> int:
        return len(self.words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.words == other.words

    def encode(self, caption: str, max_len: int | None = None) -> list[int]:
        """Caption -> [bos, w1, ..., wn, eos], words truncated to `max_len`."""
        ids = [self.index.get(token, self.unk_id) for token in tokenize(caption)]
        return [self.bos_id, *ids[:max_len], self.eos_id]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, stopping at `<eos>` and skipping `<bos>`/`<pad>`."""
        return " ".join(self.decode_words(ids))

    def decode_words(self, ids: Iterable[int]) -> list[str]:
        before_eos = itertools.takewhile(lambda i: i != self.eos_id, map(int, ids))
        return [self.words[i] if 0 <= i < len(self.words) else UNK for i in before_eos
                if i not in (self.bos_id, self.pad_id)]

    def to_list(self) -> list[str]:
        return list(self.words)

    def save(self, path: str | Path) -> None:
        """Write `{"words": [...]}` atomically: a full disk keeps the previous file."""
        text = json.dumps({"words": self.words}, indent=0)
        write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """A vocab.json as `save` writes it (a run's), read within the caps of a model's files; whatever else it
        holds is one DatasetError naming it."""
        path = Path(path)
        try:
            document = read_json(path, "vocabulary file", DatasetError, MODEL_JSON_BYTES)
        except FileNotFoundError:
            raise DatasetError(f"{path}: vocabulary file not found") from None
        if not isinstance(document, dict) or "words" not in document:
            raise DatasetError(f'{path}: not a vocabulary file (expected an object with "words")')
        try:
            return cls(check_words(document["words"], str(path)))
        except ConfigError as e:
            raise DatasetError(str(e)) from None


def bad_ending_ids(index: Mapping[str, int]) -> tuple[int, ...]:
    """The ids of a vocabulary's words in BAD_ENDINGS (`index`: word -> id, `Vocabulary.index`), in order."""
    return tuple(sorted(index[word] for word in BAD_ENDINGS if word in index))
