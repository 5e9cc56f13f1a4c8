"""Tokenisation as the COCO evaluation does it, and the vocabulary."""

from __future__ import annotations

import contextlib
import errno
import json
from pathlib import Path

import pytest
from helpers import fifo_with_a_writer

from captioner.core.errors import DatasetError, StorageError
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
    with pytest.raises(DatasetError, match="bad.json: not valid JSON"):
        Vocabulary.load(tmp_path / "bad.json")
    with pytest.raises(DatasetError, match="vocabulary file not found"):
        Vocabulary.load(tmp_path / "missing.json")
    with pytest.raises(DatasetError, match="must start with"):
        Vocabulary(["a", "b"])


SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
BAD_VOCABULARIES = {  # what vocab.json holds -> what the one line says after its path
    "words a number": ('{"words": 5}', "vocab must be a list of words"),
    "words an object": ('{"words": {"<pad>": 0}}', "vocab must be a list of words"),
    "a word a number": (json.dumps({"words": [*SPECIAL, 5]}), "vocab must be a list of words"),
    "no specials": ('{"words": ["a", "b"]}', "vocab must start with <pad>, <bos>, <eos>, <unk>"),
    "a word twice": (json.dumps({"words": [*SPECIAL, "dog", "dog"]}), "vocab holds the word 'dog' twice"),
    "a line break": (json.dumps({"words": [*SPECIAL, "a\nb"]}), "holds a space or a control character"),
    "a list": ("[1]", 'not a vocabulary file (expected an object with "words")'),
    "not UTF-8": (b'{"words": ["\xff"]}', "not valid JSON (not UTF-8 text"),
    "nested": ("[" * 100_000, "nested deeper than the 32 levels"),
}


@pytest.mark.parametrize("kind", [*BAD_VOCABULARIES, "a folder", "a pipe"])
def test_a_damaged_vocabulary_file_is_one_line_naming_it(tmp_path: Path, kind: str) -> None:
    """`Vocabulary.load` of a run's vocab.json: a number, an object, bytes that are not UTF-8, a folder were
    tracebacks (TypeError, UnicodeDecodeError, IsADirectoryError), a pipe waited forever, a word that is not one
    was taken, and a refused list did not name the file."""
    path = tmp_path / "vocab.json"
    if kind == "a folder":
        path.mkdir()
        says = "vocabulary file is a folder, not a file"
    elif kind == "a pipe":
        context = fifo_with_a_writer(path)
        says = "vocabulary file is not a regular file"
    else:
        content, says = BAD_VOCABULARIES[kind]
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with context if kind == "a pipe" else contextlib.nullcontext(), pytest.raises(DatasetError) as raised:
        Vocabulary.load(path)
    assert str(raised.value).startswith(f"{path}: ") and says in str(raised.value), raised.value
    assert "\n" not in str(raised.value)


def test_saving_a_vocabulary_over_another_on_a_full_disk_keeps_the_other(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "vocab.json"
    Vocabulary.build(["a dog"]).save(path)
    before = path.read_bytes()

    def full_disk(self: Path, *args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(StorageError, match="No space left on device.*the previous vocab.json is kept"):
        Vocabulary.build(["a cat on a mat"]).save(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["vocab.json"]
