"""Tokenisation as the COCO evaluation does it, and the vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

from captioner.core.errors import DatasetError
from captioner.text.vocab import Vocabulary, tokenize


def test_tokenize_like_the_coco_evaluation() -> None:
    assert tokenize("A man's dog doesn't run, 'quickly'!") == ["a", "man", "'s", "dog", "does", "n't", "run", "quickly"]
    assert tokenize("Two dogs . Playing in the SNOW") == ["two", "dogs", "playing", "in", "the", "snow"]
    assert tokenize("a red-and-white bus; on 5th street...") == ["a", "red-and-white", "bus", "on", "5th", "street"]
    assert tokenize("  ") == []


def test_build_encode_decode() -> None:
    vocab = Vocabulary.build(["a dog runs", "a dog sits", "a cat"], min_count=2)
    assert vocab.words[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert vocab.words[4:] == ["a", "dog"]  # most frequent first; runs/sits/cat below min count
    ids = vocab.encode("A dog flies")
    assert ids == [vocab.bos_id, vocab.index["a"], vocab.index["dog"], vocab.unk_id, vocab.eos_id]
    assert vocab.decode(ids) == "a dog <unk>"
    assert vocab.decode([vocab.index["a"], vocab.eos_id, vocab.index["dog"]]) == "a"
    assert len(vocab.encode("a dog a dog a dog", max_len=2)) == 4


def test_json_round_trip(tmp_path: Path) -> None:
    vocab = Vocabulary.build(["the quick brown fox", "the lazy dog"])
    vocab.save(tmp_path / "vocab.json")
    assert Vocabulary.load(tmp_path / "vocab.json") == vocab
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(DatasetError, match="bad.json: not a vocabulary file"):
        Vocabulary.load(tmp_path / "bad.json")
    with pytest.raises(DatasetError, match="vocabulary file not found"):
        Vocabulary.load(tmp_path / "missing.json")
    with pytest.raises(DatasetError, match="must start with"):
        Vocabulary(["a", "b"])
