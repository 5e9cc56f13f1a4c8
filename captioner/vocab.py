"""Tokenisation and the word vocabulary.

The tokenizer follows what the official COCO caption evaluation does before scoring (the PTB
tokenizer of pycocoevalcap): lower-case, contractions split ("don't" -> "do n't"), punctuation
removed. It is pure Python, so it needs no downloaded data (no nltk packages) and no Java.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from captioner.errors import DatasetError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)

# Contractions the PTB tokenizer splits off as tokens of their own.
_SUFFIXES = ("n't", "'s", "'re", "'ve", "'ll", "'d", "'m")
_CONTRACTION = re.compile(r"\b(\w+?)(" + "|".join(_SUFFIXES) + r")\b")
# Anything that is not a letter, digit or apostrophe separates words; pycocoevalcap drops the
# punctuation tokens afterwards, so dropping them here gives the same words.
_SEPARATOR = re.compile(r"[^a-z0-9']+")


def tokenize(text: str) -> list[str]:
    """Split a caption into lower-case word tokens, as the COCO evaluation tokenizer does."""
    text = text.lower().replace("`", "'")
    text = _CONTRACTION.sub(r"\1 \2", text)
    tokens = []
    for token in _SEPARATOR.split(text):
        if token not in _SUFFIXES:
            token = token.strip("'")  # quotes, not contractions
        if token:
            tokens.append(token)
    return tokens


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
        if max_len is not None:
            ids = ids[:max_len]
        return [self.bos_id, *ids, self.eos_id]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, stopping at `<eos>` and skipping `<bos>`/`<pad>`."""
        return " ".join(self.decode_words(ids))

    def decode_words(self, ids: Iterable[int]) -> list[str]:
        words = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i in (self.bos_id, self.pad_id):
                continue
            words.append(self.words[i] if 0 <= i < len(self.words) else UNK)
        return words

    def to_list(self) -> list[str]:
        return list(self.words)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"words": self.words}, indent=0))

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        path = Path(path)
        try:
            words = json.loads(path.read_text())["words"]
        except FileNotFoundError:
            raise DatasetError(f"{path}: vocabulary file not found") from None
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DatasetError(f"{path}: not a vocabulary file ({e})") from None
        return cls(words)
