"""METEOR 1.5 as pycocoevalcap runs it, spread over several Java processes. Each SCORE line depends
on its image alone, so each process scores and EVALs a contiguous shard; one more EVAL of the
statistics summed as `MeteorStats.addStats` does gives exactly pycocoevalcap's corpus score."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from captioner.evaluation.java import JavaToolError, LineTool, exchange
from captioner.evaluation.paraphrases import full_table, meteor_dir

# Below this many images per process, another JVM (about 6 s to load its table) costs more than it saves.
MIN_IMAGES_PER_PROCESS = 5000
MAX_PROCESSES = 8
PROCESS_MEMORY_BYTES = 2 << 30  # each runs with -Xmx2G, as pycocoevalcap starts it
# The client compiler and the serial collector: METEOR's work is short and single-threaded, so the
# server compiler's and G1's threads cost more than they give (`python -m benchmarks metrics`).
JVM_OPTIONS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


def default_processes(num_images: int) -> int:
    """METEOR processes for `num_images`: one per free core (usable cores less the 1-minute load), at
    most one per MIN_IMAGES_PER_PROCESS images and as many as memory holds, at least one
    (`python -m benchmarks metrics --meteor-processes P`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free = cores - int(os.getloadavg()[0]) if hasattr(os, "getloadavg") else cores
    by_size = math.ceil(num_images / MIN_IMAGES_PER_PROCESS)
    return max(1, min(free, by_size, _available_memory() // PROCESS_MEMORY_BYTES, MAX_PROCESSES))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
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
        args = [*JVM_OPTIONS, *meteor_arguments(paraphrases)]
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
        per_image: list[float] = []
        for k, shard_answers in enumerate(answers):
            per_image += _floats(shard_answers[: len(shards[k])], tools[k].name)  # then the shard's own total
        return _floats(answers[0][-1:], tools[0].name)[0], per_image


# A statistics line: hypothesis and reference length and function words, then per matcher stage
# (exact, stem, synonym, paraphrase) the matched content and function words of each side, then the
# chunk count and the matched words of each side.
_STATS_FIELDS = 23
_CHUNKS = 20


def _sum_stats(stats: list[str], name: str) -> str:
    """The sum of METEOR statistics lines as `MeteorStats.addStats` forms it: field by field from
    zero, in image order, except that an image whose words all match in one chunk adds no chunk."""
    bad = next((line for line in stats if not _is_numbers(line) or len(line.split()) != _STATS_FIELDS), None)
    if bad is not None:
        raise JavaToolError(f"{name} failed: answered {bad[:80]!r} instead of alignment statistics")
    totals = [0.0] * _STATS_FIELDS
    for line in stats:
        row = [float(x) for x in line.split()]
        test_matches = ref_matches = 0.0
        for stage in range(4, 20, 4):  # content then function-word matches of each stage, as parsed
            test_matches = test_matches + row[stage] + row[stage + 2]
            ref_matches = ref_matches + row[stage + 1] + row[stage + 3]
        if test_matches == row[0] and ref_matches == row[1] and row[_CHUNKS] == 1:
            row[_CHUNKS] = 0.0  # addStats leaves out the one chunk of a whole match
        totals = [total + x for total, x in zip(totals, row)]
    return " ".join(repr(x) for x in totals)


def _is_numbers(line: str) -> bool:
    try:
        [float(x) for x in line.split()]
    except ValueError:
        return False
    return bool(line.split())


def _floats(lines: list[bytes], name: str) -> list[float]:
    try:
        return [float(line) for line in lines]
    except ValueError:
        bad = next(line for line in lines if not _is_numbers(line.decode("utf-8", "replace")))
        raise JavaToolError(f"{name} failed: answered {bad[:80]!r} instead of a score") from None
