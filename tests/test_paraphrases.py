"""METEOR's paraphrase table cut to an evaluation's words: exactly the entries whose words all occur,
byte for byte and in order; an index built once and rebuilt when damaged; the whole table when the
cache cannot be written; METEOR's own normaliser for the words. (The same scores as the whole table, on real captions:
tests/test_scorers.py.)"""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest

from captioner.evaluation import meteor
from captioner.evaluation.meteor import cut_table, load_index, segments

ENTRIES = [  # probability, phrase, paraphrase
    (b"0.5", b"a dog", b"the dog"),
    (b"0.25", b"runs", b"is running"),
    (b"0.125", b"a cat", b"the cat"),  # "cat" is in no caption below
    (b"1.0E-4", b"grass", b"lawn"),  # "lawn" is in no caption: the paraphrase must occur too
    (b"0.0625", b"the dog", b"a dog"),
    (b"0.03125", b"on", b"upon"),
    (b"0.2", b"is running", b"runs"),
    (b"0.3", b"the the", b"a a"),  # a word twice in a phrase counts twice
    (b"0.1", b"dog dog", b"dogs"),
]
WORDS = {"a", "the", "dog", "runs", "is", "running", "grass", "on"}
KEPT = [0, 1, 4, 6, 7]


def entry_bytes(entry: tuple[bytes, bytes, bytes]) -> bytes:
    return b"".join(field + b"\n" for field in entry)


@pytest.fixture
def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "paraphrase-xx.gz"
    path.write_bytes(gzip.compress(b"".join(map(entry_bytes, ENTRIES))))
    return path


def test_the_cut_keeps_the_entries_whose_words_all_occur_byte_for_byte_and_in_order(table: Path,
                                                                                    tmp_path: Path) -> None:
    index = load_index(table)
    assert index.kept_entries(WORDS).tolist() == KEPT
    index.write_entries(index.kept_entries(WORDS), tmp_path / "cut.gz")
    assert gzip.decompress((tmp_path / "cut.gz").read_bytes()) == b"".join(entry_bytes(ENTRIES[k]) for k in KEPT)
    assert index.kept_entries(WORDS | {"lawn"}).tolist() == [0, 1, 3, 4, 6, 7]
    assert index.kept_entries(WORDS | {"dogs"}).tolist() == [*KEPT, 8]
    assert index.kept_entries({"the", "a"}).tolist() == [7]
    assert index.kept_entries(set()).tolist() == []


def test_the_index_is_built_once_and_again_when_damaged(table: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=meteor.__name__):
        load_index(table)
        load_index(table)
    assert sum("indexing" in r.getMessage() for r in caplog.records) == 1
    folder = next(p for p in (table.parent / "cache").iterdir() if p.is_dir())
    damaged = folder / "entry_phrases.npy"
    damaged.write_bytes(damaged.read_bytes()[:-5])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=meteor.__name__):
        assert load_index(table).kept_entries(WORDS).tolist() == KEPT
    assert sum("indexing" in r.getMessage() for r in caplog.records) == 1


def test_segments_are_the_fields_meteor_normalises() -> None:
    assert segments(["SCORE ||| the dog runs ||| a dog ||| a dog runs", "SCORE ||| x ||| y"]) == [
        "the dog runs", "a dog", "a dog runs", "x", "y"]


@pytest.mark.usefixtures("java")
def test_cut_table_uses_meteors_normaliser_and_writes_the_cut(table: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meteor, "MAX_KEPT_SHARE", 1.0)  # 5 of this table's 9 entries apply
    words = meteor.normalized_words(["A Dog's t-shirt, on GRASS."])
    assert {"a", "dog", "'s", "t", "shirt", ",", "on", "grass", "."} <= words and "A" in words
    cut = cut_table(["SCORE ||| The dog is running on grass ||| A dog runs"], tmp_path, table)
    assert cut is not None
    assert gzip.decompress(cut.read_bytes()) == b"".join(entry_bytes(ENTRIES[k]) for k in KEPT)


@pytest.mark.usefixtures("java")
def test_a_cache_that_cannot_be_written_reads_the_whole_table_with_one_line(
    table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(blocker / "cache"))  # a folder inside a file: cannot be made
    with caplog.at_level(logging.WARNING, logger=meteor.__name__):
        assert cut_table(["SCORE ||| a dog ||| the dog"], tmp_path, table) is None
    [record] = caplog.records
    assert "whole paraphrase table" in record.getMessage() and "\n" not in record.getMessage()


def test_most_entries_kept_reads_the_whole_table(table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meteor, "normalized_words", lambda texts: WORDS)
    monkeypatch.setattr(meteor, "MAX_KEPT_SHARE", 0.5)
    assert cut_table(["SCORE ||| a ||| b"], tmp_path, table) is None  # 5 of 9 entries
    monkeypatch.setattr(meteor, "MAX_KEPT_SHARE", 0.6)
    assert cut_table(["SCORE ||| a ||| b"], tmp_path, table) is not None
    monkeypatch.setattr(meteor, "MAX_TEXTS", 3)
    monkeypatch.setattr(meteor, "normalized_words", lambda texts: pytest.fail("normalised past MAX_TEXTS"))
    # four texts: not even normalised
    assert cut_table(["SCORE ||| a ||| b", "SCORE ||| a ||| b"], tmp_path, table) is None
