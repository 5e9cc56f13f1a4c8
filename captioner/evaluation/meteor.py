"""METEOR 1.5 as pycocoevalcap runs it, over several Java processes each reading a paraphrase table cut to
the words of one evaluation (docs/evaluation.md): each scores and EVALs a contiguous shard, and one more EVAL
of the statistics summed as `MeteorStats.addStats` does gives exactly pycocoevalcap's corpus score."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import math
import mmap
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from captioner.core.machine_cache import cache_dir, exclusive
from captioner.evaluation.java import JavaToolError, LineTool, exchange, run_java

logger = logging.getLogger(__name__)

INDEX_VERSION = 2
# Past these bounds the cut (a normaliser run over every text, then METEOR reading the kept share)
# costs more than the whole table's 10 s (`python -m benchmarks metrics`).
MAX_TEXTS = 20_000
MAX_KEPT_SHARE = 0.3
NORMALIZER = "edu.cmu.meteor.util.Normalizer"
# Below this many images per process, another JVM (about 6 s to load its table) costs more than it saves.
MIN_IMAGES_PER_PROCESS = 5000
MAX_PROCESSES = 8
PROCESS_MEMORY_BYTES = 2 << 30  # each runs with -Xmx2G, as pycocoevalcap starts it


def meteor_dir() -> Path:
    from pycocoevalcap.meteor import meteor

    return Path(meteor.__file__).resolve().parent


def full_table() -> Path:
    """The English paraphrase table METEOR reads by default (pycocoevalcap ships it)."""
    return meteor_dir() / "data" / "paraphrase-en.gz"


def segments(score_lines: Iterable[str]) -> list[str]:
    """The texts METEOR normalises in its SCORE lines: every "|||"-separated field after the first."""
    return [field.strip() for line in score_lines for field in line.split("|||")[1:]]


def normalized_words(texts: list[str]) -> set[str]:
    """Every token METEOR scores in `texts`: its normaliser's output (language en, punctuation
    kept, as -norm runs it), in both the case it gives and lower case (-norm lower-cases after)."""
    if not texts:
        return set()
    output = run_java("METEOR normaliser", ["-cp", "meteor-1.5.jar", NORMALIZER, "en", "true"], meteor_dir(),
                      len(texts), stdin="".join(text.replace("\n", " ").replace("\r", " ") + "\n" for text in texts))
    words = set(output.split())
    return words | {word.lower() for word in words}


class ParaphraseIndex:
    """Which words each entry of a paraphrase table holds, as inverted lists (a word's phrases, a
    phrase's entries), and where each entry's bytes lie in the uncompressed table.txt beside them."""

    FILES = ("entry_phrases", "entry_ends", "phrase_lengths", "word_phrase_starts", "word_phrases",
             "phrase_entry_starts", "phrase_entries")

    def __init__(self, folder: Path) -> None:
        self.text = folder / "table.txt"
        words = json.loads((folder / "words.json").read_text(encoding="utf-8"))
        self.word_ids = {word: k for k, word in enumerate(words)}
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in self.FILES}
        self.entry_phrases = arrays["entry_phrases"]  # (E, 2) each entry's phrase and paraphrase
        self.entry_ends = arrays["entry_ends"]  # (E,) byte offset after each entry's three lines
        self.phrase_lengths = arrays["phrase_lengths"]  # (P,) words in each phrase
        self.word_phrase_starts = arrays["word_phrase_starts"]  # (W + 1,) each word's run in word_phrases
        self.word_phrases = arrays["word_phrases"]  # (sum of phrase lengths,) a phrase per word occurrence
        self.phrase_entry_starts = arrays["phrase_entry_starts"]  # (P + 1,) a phrase's run in phrase_entries
        self.phrase_entries = arrays["phrase_entries"]  # (E,) the entries, by their first phrase
        entries, phrases = len(self.entry_ends), len(self.phrase_lengths)
        if (self.entry_phrases.shape != (entries, 2) or len(self.phrase_entries) != entries
                or len(self.word_phrase_starts) != len(words) + 1 or len(self.phrase_entry_starts) != phrases + 1
                or int(self.word_phrase_starts[-1]) != len(self.word_phrases)
                or self.text.stat().st_size != (int(self.entry_ends[-1]) if entries else 0)):
            raise ValueError(f"the paraphrase index in {folder} is inconsistent")

    @staticmethod
    def build(table: Path, folder: Path) -> None:
        """Index `table` (gzipped lines: probability, phrase, paraphrase) into `folder`."""
        text = gzip.decompress(table.read_bytes())
        (folder / "table.txt").write_bytes(text)
        lines = text.split(b"\n")
        del text
        if lines and lines[-1] == b"":
            lines.pop()
        if len(lines) % 3:
            raise ValueError(f"{table}: {len(lines)} lines, not three per entry")
        ends = np.cumsum(np.fromiter(map(len, lines), dtype=np.int64, count=len(lines)) + 1)[2::3]  # (E,)
        if len(ends) and ends[-1] >= 1 << 32:
            raise ValueError(f"{table}: larger than 4 GB uncompressed")
        phrase_ids: dict[bytes, int] = {}
        first = np.fromiter((phrase_ids.setdefault(p, len(phrase_ids)) for p in lines[1::3]), np.uint32)  # (E,)
        second = np.fromiter((phrase_ids.setdefault(p, len(phrase_ids)) for p in lines[2::3]), np.uint32)  # (E,)
        del lines
        word_ids: dict[bytes, int] = {}
        lengths, flat = [], []
        for phrase in phrase_ids:
            words = phrase.split()
            lengths.append(len(words))
            flat.extend(word_ids.setdefault(w, len(word_ids)) for w in words)
        if not 0 < min(lengths, default=1) <= max(lengths, default=1) < 256:
            raise ValueError(f"{table}: a phrase of no words or of more than 255")
        occurrences = np.asarray(flat, dtype=np.int64)  # (sum of lengths,) word id per word of every phrase
        phrase_of = np.repeat(np.arange(len(lengths), dtype=np.uint32), lengths)  # (sum of lengths,)
        by_first = np.argsort(first, kind="stable").astype(np.uint32)  # (E,)
        arrays = {
            "entry_phrases": np.stack([first, second], axis=1),  # (E, 2)
            "entry_ends": ends.astype(np.uint32),
            "phrase_lengths": np.asarray(lengths, dtype=np.uint8),
            "word_phrase_starts": _starts(np.bincount(occurrences, minlength=len(word_ids))),  # (W + 1,)
            "word_phrases": phrase_of[np.argsort(occurrences, kind="stable")],
            "phrase_entry_starts": _starts(np.bincount(first, minlength=len(phrase_ids))),  # (P + 1,)
            "phrase_entries": by_first,
        }
        for name, array in arrays.items():
            np.save(folder / f"{name}.npy", array)
        words = [w.decode("utf-8", errors="surrogateescape") for w in word_ids]
        (folder / "words.json").write_text(json.dumps(words, ensure_ascii=True), encoding="utf-8")

    def kept_entries(self, words: set[str]) -> np.ndarray:
        """The entries whose every word is in `words`, in table order."""
        ids = np.fromiter((self.word_ids[w] for w in words if w in self.word_ids), dtype=np.int64)  # (known,)
        starts = np.asarray(self.word_phrase_starts)
        phrases = self.word_phrases[_ranges(starts[ids], starts[ids + 1])]  # a phrase per known word in it
        # A phrase is whole when as many of its words are known as it has (a repeat counts twice).
        whole = np.bincount(phrases, minlength=len(self.phrase_lengths)) == self.phrase_lengths  # (P,)
        ok = np.flatnonzero(whole)
        starts = np.asarray(self.phrase_entry_starts)
        candidates = self.phrase_entries[_ranges(starts[ok], starts[ok + 1])]  # entries, first phrase whole
        return np.sort(candidates[whole[self.entry_phrases[candidates, 1]]]).astype(np.int64)  # (kept,)

    def write_entries(self, kept: np.ndarray, out: Path) -> None:
        """Copy the `kept` entries of the table, byte for byte and in order, into the gzip file `out`."""
        # Stored, not compressed: METEOR reads any gzip, and this one costs neither side a deflate.
        with gzip.open(out, "wb", compresslevel=0) as f:
            if not len(kept):
                return
            ends = np.asarray(self.entry_ends, dtype=np.int64)
            starts = np.concatenate([[0], ends[:-1]])  # (E,)
            # Runs of consecutive kept entries are copied as one slice.
            breaks = np.flatnonzero(np.diff(kept) != 1) + 1  # (runs - 1,)
            run_starts = starts[kept[np.concatenate([[0], breaks])]].tolist()  # (runs,)
            run_ends = ends[kept[np.concatenate([breaks - 1, [len(kept) - 1]])]].tolist()  # (runs,)
            with open(self.text, "rb") as source, mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as data:
                for s, e in zip(run_starts, run_ends):
                    f.write(data[s:e])


def _starts(counts: np.ndarray) -> np.ndarray:
    """CSR run starts from run lengths: (n,) -> (n + 1,)."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The indices start..end-1 of every run, one after the other, without a Python loop."""
    lengths = ends.astype(np.int64) - starts  # (runs,)
    offsets = np.cumsum(lengths) - lengths  # (runs,) where each run begins in the output
    return np.repeat(starts.astype(np.int64) - offsets, lengths) + np.arange(int(lengths.sum()))  # (sum lengths,)


def load_index(table: Path) -> ParaphraseIndex:
    """The index of `table`, built into the cache folder by the first process that needs it (the
    others wait for it on a lock); one that cannot be read (damaged, cut short) is built again."""
    stat = table.stat()
    with open(table, "rb") as f:
        digest = hashlib.sha1(f.read(1 << 20))  # the size, time and first megabyte name the table
    digest.update(f"{stat.st_size} {stat.st_mtime_ns} {INDEX_VERSION}".encode())
    folder = cache_dir() / f"meteor-paraphrase-index-{digest.hexdigest()[:16]}"
    if (folder / "done").exists():
        with contextlib.suppress(OSError, ValueError):
            return ParaphraseIndex(folder)
    with exclusive(folder.name):
        if (folder / "done").exists():  # built while this process waited, or damaged
            with contextlib.suppress(OSError, ValueError):
                return ParaphraseIndex(folder)
        logger.info("METEOR: indexing its paraphrase table once for this machine, into %s", folder)
        building = Path(tempfile.mkdtemp(prefix=f"{folder.name}-", dir=folder.parent))
        try:
            ParaphraseIndex.build(table, building)
            (building / "done").touch()
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(building, folder)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return ParaphraseIndex(folder)


def cut_table(score_lines: list[str], out_dir: Path, table: Path | None = None) -> Path | None:
    """The entries of `table` (METEOR's English one by default) that `score_lines` can match, as a
    table in `out_dir`; None when METEOR should read the whole table (said in one log line)."""
    table = table or full_table()
    texts = segments(score_lines)
    if len(texts) > MAX_TEXTS:
        logger.debug("METEOR: %d texts; reading the whole paraphrase table", len(texts))
        return None
    try:
        index = load_index(table)
        kept = index.kept_entries(normalized_words(texts))
        if len(kept) > MAX_KEPT_SHARE * len(index.entry_ends):
            logger.debug("METEOR: %d of %d paraphrase entries apply; reading the whole table", len(kept),
                         len(index.entry_ends))
            return None
        out = out_dir / "paraphrase-cut.gz"
        index.write_entries(kept, out)
    except (OSError, ValueError, JavaToolError) as e:
        # str(e), not e: its frames hold the index
        logger.warning("METEOR: reading its whole paraphrase table (about 10 s): %s", str(e))
        return None
    logger.debug("METEOR: %d of %d paraphrase entries apply to this evaluation", len(kept), len(index.entry_ends))
    return out


def default_processes(num_images: int) -> int:
    """METEOR processes for `num_images`: one per free core (usable cores less the 1-minute load), at
    most one per MIN_IMAGES_PER_PROCESS images and as many as memory holds, at least one
    (`python -m benchmarks metrics --meteor-processes P`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free = cores - int(os.getloadavg()[0]) if hasattr(os, "getloadavg") else cores
    by_size = math.ceil(num_images / MIN_IMAGES_PER_PROCESS)
    return max(1, min(free, by_size, _available_memory() // PROCESS_MEMORY_BYTES, MAX_PROCESSES))


def _available_memory() -> int:
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return MAX_PROCESSES * PROCESS_MEMORY_BYTES  # unknown: do not limit by memory


def meteor_arguments(paraphrases: Path | None = None) -> list[str]:
    """pycocoevalcap's METEOR command after `java` (run in `meteor_dir()`), its paraphrase table
    named by path: METEOR finds its own through the jar's URL, which a folder with a space breaks."""
    table = paraphrases or full_table()
    return ["-jar", "-Xmx2G", "meteor-1.5.jar", "-", "-", "-stdio", "-l", "en", "-norm", "-a", str(table)]


def score_line(hypothesis: str, references: Sequence[str]) -> str:
    """pycocoevalcap's SCORE line for one image (its hypothesis loses any "|||" and double space)."""
    hypothesis = hypothesis.replace("|||", "").replace("  ", " ")
    return " ||| ".join(("SCORE", " ||| ".join(references), hypothesis))


class MeteorPool:
    """`processes` METEOR processes, started at once, each reading the paraphrase table `paraphrases`
    (else METEOR's whole English one). A context manager: leaving it kills and reaps them."""

    def __init__(self, processes: int, paraphrases: Path | None = None) -> None:
        if processes < 1:
            raise ValueError(f"METEOR needs at least one process, got {processes}")
        cwd = meteor_dir()
        args = meteor_arguments(paraphrases)
        self.tools: list[LineTool] = []
        try:
            for k in range(processes):
                self.tools.append(LineTool(f"METEOR (process {k + 1} of {processes})", args, cwd))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> MeteorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kill(self) -> None:
        """Stop every process now; a `score` running in another thread then fails at once."""
        for tool in self.tools:
            tool.kill()

    def close(self) -> None:
        for tool in self.tools:
            tool.close()

    def score(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> tuple[float, list[float]]:
        """The corpus METEOR and each image's, for tokenised hypotheses and their references."""
        n = len(hypotheses)
        shards = np.array_split(np.arange(n), min(len(self.tools), n))
        tools = self.tools[: len(shards)]
        lines = [score_line(h, refs) for h, refs in zip(hypotheses, references)]
        requests = [("".join(lines[i] + "\n" for i in shard).encode(), len(shard)) for shard in shards]
        stats = [line.decode().strip() for answers in exchange(tools, requests) for line in answers]

        corpus_stats = _sum_stats(stats, tools[0].name)
        requests = [(f"EVAL ||| {' ||| '.join(stats[i] for i in shard)}\n".encode(), len(shard) + 1)
                    for shard in shards]
        first_data, first_lines = requests[0]
        requests[0] = (first_data + f"EVAL ||| {corpus_stats}\n".encode(), first_lines + 2)
        answers = exchange(tools, requests)
        per_image = [score for answered, shard, tool in zip(answers, shards, tools)
                     for score in _floats(answered[: len(shard)], tool.name)]  # its images', then its own total
        return _floats(answers[0][-1:], tools[0].name)[0], per_image


# A statistics line: hypothesis and reference length and function words, then per matcher stage
# (exact, stem, synonym, paraphrase) the matched content and function words of each side, then the
# chunk count and the matched words of each side.
_STATS_FIELDS = 23
_CHUNKS = 20


def _sum_stats(stats: list[str], name: str) -> str:
    """The sum of METEOR statistics lines as `MeteorStats.addStats` forms it: field by field from
    zero, in image order, except that an image whose words all match in one chunk adds no chunk."""
    totals = [0.0] * _STATS_FIELDS
    for line in stats:
        try:
            row = [float(x) for x in line.split()]
        except ValueError:
            row = []
        if len(row) != _STATS_FIELDS:
            raise JavaToolError(f"{name} failed: answered {line[:80]!r} instead of alignment statistics")
        test_matches = ref_matches = 0.0
        for stage in range(4, 20, 4):  # content then function-word matches of each stage, as parsed
            test_matches = test_matches + row[stage] + row[stage + 2]
            ref_matches = ref_matches + row[stage + 1] + row[stage + 3]
        if test_matches == row[0] and ref_matches == row[1] and row[_CHUNKS] == 1:
            row[_CHUNKS] = 0.0  # addStats leaves out the one chunk of a whole match
        totals = [total + x for total, x in zip(totals, row)]
    return " ".join(repr(x) for x in totals)


def _floats(lines: list[bytes], name: str) -> list[float]:
    scores = []
    for line in lines:
        try:
            scores.append(float(line))
        except ValueError:
            raise JavaToolError(f"{name} failed: answered {line[:80]!r} instead of a score") from None
    return scores
