"""The search conformance cases as data: tests/data/search_cases.json, read by the Python suite
(tests/test_search_conformance.py: the torch and the numpy search) and by Node's (tests/js/search.test.mjs:
the web page's search.js), so that the three searches answer the same cases.

Every case decodes with a `TableDecoder`: log p(next | prev, t, image) = log_softmax(table[prev] + drift[t]
+ bias of the image), attending to the image's cells. The file holds that step as lookup tables, per table
set: for each image, step t and previous word the (V,) log-probabilities, and for each image and previous
word the (N,) attention, as base64 of little-endian float32. Torch computes them in float64 and rounds
them once to float32: torch's float32 randn and log_softmax differ in the last bit between CPU kernels
(AVX2, AVX-512), the rounded float64 does not, so the file regenerates bit for bit anywhere. A case
names its tables, the special ids, the options and the search, and holds what the numpy search returns
on all the tables' images (float32 values in their shortest decimals: read back as float32 they are
exact). Edit the cases here, never the file, and rewrite it with `python -m tests.search_cases`; a test
holds the two equal.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from captioner.core.errors import ConfigError
from captioner.deploy import numpy_search
from captioner.deploy.numpy_search import SearchOptions, TokenRules
from captioner.models.decoder import Decoder, Memory, State
from captioner.models.decoding import DecodeOptions

PATH = Path(__file__).resolve().parent / "data" / "search_cases.json"
REWRITE = "python -m tests.search_cases"

# A vocabulary of 8 ids: <pad>, <bos>, <eos>, <unk>, then "a" (a bad ending), "red", "circle", "square".
WORDS = ("<pad>", "<bos>", "<eos>", "<unk>", "a", "red", "circle", "square")
V = len(WORDS)
PAD, BOS, EOS, UNK, A, RED, CIRCLE, SQUARE = range(V)
BANNED, BAD_ENDINGS = (PAD, BOS, UNK), (A,)
MAX_STEPS = 16  # the most steps a table set has
SEARCH_FIELDS = ("beam_size", "max_length", "length_penalty", "block_trigrams", "min_length", "suppress_bad_endings")


class TableDecoder(Decoder):
    """log p(next | prev, t, image) = log_softmax(table[prev] + drift[t] + bias of the image), the
    bias being the image's first feature row (feats (B, N, V)) and the small drift at step t
    keeping two captions made of the same word pairs apart; every step attends to the image's
    cells by a softmax of their feature at the previous word, so each image and word has its own
    map (a caption's maps follow its words: a map taken from the wrong beam shows)."""

    vocab_size = V

    def __init__(self, table: torch.Tensor, drift: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table)  # (V, V): prev -> next
        self.register_buffer("drift", drift)  # (T, V): per step

    def prepare(self, feats: torch.Tensor) -> Memory:
        return {"bias": feats[:, 0, :V], "cells": feats}  # (B, V), (B, N, V)

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        return {"steps": memory["bias"].new_zeros(memory["bias"].shape[0])}  # (B,)

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        logits = self.table[prev_tokens] + self.drift[state["steps"].long()] + memory["bias"]  # (R, V)
        logprobs = logits.log_softmax(dim=-1)  # (R, V)
        cells = memory["cells"][torch.arange(len(prev_tokens)), :, prev_tokens]  # (R, N): each cell's at prev
        return logprobs, cells.softmax(dim=-1)[:, None, None, :], {"steps": state["steps"] + 1}  # (R, 1, 1, N)


@dataclass(frozen=True)
class TableSet:
    """A TableDecoder (a seeded random table, plus `logits` such as ("red_circle", 4.0) added to
    (prev, next)) and its images (seeded random feats (batch, 3, V)), stepped `steps` times."""

    seed: int = 0
    logits: tuple[tuple[str, float], ...] = ()
    batch: int = 4
    feats_seed: int = 1
    steps: int = 8
    endless: tuple[int, ...] = ()  # images whose <eos> bias is -30: they never end
    twins: bool = False  # a caption starting with "red" ties exactly with its twin starting with "circle"

    def decoder_and_feats(self) -> tuple[TableDecoder, torch.Tensor]:
        """The decoder and feats (B, N, V), in float64."""
        generator = torch.Generator().manual_seed(self.seed)
        table = torch.randn(V, V, generator=generator, dtype=torch.float64)  # (V, V)
        drift = 0.1 * torch.randn(MAX_STEPS, V, generator=generator, dtype=torch.float64)  # (T, V)
        names = {"bos": BOS, "eos": EOS, "unk": UNK, "a": A, "red": RED, "circle": CIRCLE, "square": SQUARE}
        for key, value in self.logits:
            prev, word = key.split("_")
            table[names[prev] if prev != "any" else slice(None), names[word]] += value
        generator = torch.Generator().manual_seed(self.feats_seed)
        feats = torch.randn(self.batch, 3, V, generator=generator, dtype=torch.float64)  # (B, N, V)
        feats[list(self.endless), 0, EOS] = -30.0
        if self.twins:  # after "circle" as after "red"; and after <bos>, the two words equally likely
            table[CIRCLE] = table[RED]
            table[BOS, CIRCLE], drift[0, CIRCLE], feats[:, 0, CIRCLE] = table[BOS, RED], drift[0, RED], feats[:, 0, RED]
        return TableDecoder(table, drift), feats


@dataclass
class Tables:
    """A table set's step as lookup tables, float32."""

    logprobs: np.ndarray  # (B, T, V, V): image, step, previous word -> log p(next word)
    attn: np.ndarray  # (B, V, N): image, previous word -> the attention over the image's cells

    @classmethod
    def of(cls, spec: TableSet) -> Tables:
        decoder, feats = spec.decoder_and_feats()
        B = feats.shape[0]
        memory = decoder.prepare(feats.repeat_interleave(V, dim=0))  # (B*V, ...): one row per previous word
        prev = torch.arange(V).repeat(B)  # (B*V,)
        with torch.no_grad():
            steps = [decoder.step(memory, prev, {"steps": torch.full((B * V,), float(t))})
                     for t in range(spec.steps)]  # (B*V, V), (B*V, 1, 1, N) each
        logprobs = torch.stack([s[0] for s in steps], dim=1).view(B, V, spec.steps, V).transpose(1, 2)
        attn = steps[0][1].view(B, V, -1)  # (B, V, N): the same at every step
        return cls(logprobs.float().numpy().copy(), attn.float().numpy().copy())  # (B, T, V, V), (B, V, N)

    def subset(self, images: list[int]) -> Tables:
        return Tables(self.logprobs[images], self.attn[images])

    def as_json(self) -> dict:
        """The arrays as base64 of their little-endian float32 bytes, row-major: exact, and a third of
        the size of decimals."""
        B, T = self.logprobs.shape[:2]
        encode = lambda x: base64.b64encode(x.astype("<f4").tobytes()).decode()  # noqa: E731
        return {"images": B, "steps": T, "cells": self.attn.shape[2],
                "logprobs": encode(self.logprobs), "attn": encode(self.attn)}

    @classmethod
    def from_json(cls, data: dict) -> Tables:
        B, T, N = data["images"], data["steps"], data["cells"]
        decode = lambda text: np.frombuffer(base64.b64decode(text), "<f4").astype(np.float32)  # noqa: E731
        return cls(decode(data["logprobs"]).reshape(B, T, V, V), decode(data["attn"]).reshape(B, V, N))


@dataclass(frozen=True)
class Case:
    """One search: `tables` (a TableSet's name, all its images), `options` (DecodeOptions' names,
    n_best among them), special ids, and the search: "decode" (greedy for a beam of 1) or "beam"
    (the beam search whatever the beam). `alone`: each image searched alone finds the same."""

    name: str
    tables: str
    options: dict
    search: str = "decode"
    banned: tuple[int, ...] = BANNED
    bad_endings: tuple[int, ...] = BAD_ENDINGS
    alone: bool = False
    extra: dict = field(default_factory=dict)


# Each TableSet serves the cases of one test of tests/test_search_conformance.py.
TABLE_SETS = {
    "greedy": TableSet(logits=(("any_eos", -1.0),)),
    "n_best": TableSet(seed=2, feats_seed=3, steps=6),
    "length_penalty": TableSet(seed=5, logits=(("any_eos", -1.0),), batch=6, feats_seed=5, steps=4),
    "trigrams": TableSet(logits=(("red_circle", 6.0), ("circle_red", 6.0), ("bos_red", 6.0), ("any_eos", -4.0)),
                         steps=10),
    "banned": TableSet(logits=(("any_unk", 8.0), ("any_red", 6.0)), steps=6),
    "min_length": TableSet(logits=(("bos_red", 8.0), ("red_a", 8.0), ("a_eos", 8.0), ("any_eos", 2.0)), steps=6),
    "endless": TableSet(logits=(("any_eos", -50.0),), steps=5),
    "batch": TableSet(seed=6, logits=(("any_eos", 0.5),), batch=6, feats_seed=7, steps=7, endless=(2,)),
    "diverse": TableSet(seed=8, feats_seed=9, steps=6),
    "agree": TableSet(seed=10, logits=(("any_eos", 0.5),), batch=5, feats_seed=11, steps=8),
    "ties": TableSet(seed=1, logits=(("bos_red", 3.0),), batch=2, steps=4, twins=True),
    "first_word": TableSet(logits=(("bos_a", 8.0), ("a_eos", 8.0)), batch=2, steps=4),
}


def cases() -> list[Case]:
    """Every case, in the file's order."""
    found = []
    for label, options in (("plain", {}), ("trigrams", {"block_trigrams": True, "min_length": 2}),
                           ("bad_endings", {"suppress_bad_endings": True})):
        for search in ("decode", "beam"):
            found.append(Case(f"greedy/{label}/{search}", "greedy", {"beam_size": 1, "max_length": 8, **options},
                              search))
    for n_best in (4, 1):
        found.append(Case(f"n_best/{n_best}", "n_best",
                          {"beam_size": 4, "n_best": n_best, "max_length": 6, "length_penalty": 0.6}))
    for alpha in (0.0, 0.7, 2.0):  # two words: red and circle
        found.append(Case(f"length_penalty/{alpha}", "length_penalty",
                          {"beam_size": 32, "max_length": 4, "length_penalty": alpha},
                          banned=(PAD, BOS, UNK, A, SQUARE), bad_endings=()))
    for beam in (1, 3):
        for label, block in (("looping", False), ("blocked", True)):
            found.append(Case(f"trigrams/{beam}/{label}", "trigrams",
                              {"beam_size": beam, "n_best": beam, "max_length": 10, "block_trigrams": block}))
    for beam in (1, 3):
        found.append(Case(f"banned/{beam}/red_allowed", "banned", {"beam_size": beam, "max_length": 6}))
        found.append(Case(f"banned/{beam}/red_banned", "banned", {"beam_size": beam, "n_best": beam, "max_length": 6},
                          banned=(PAD, BOS, UNK, RED), bad_endings=()))
    for beam in (1, 3):
        found.append(Case(f"min_length/{beam}/plain", "min_length", {"beam_size": beam, "max_length": 6}))
        found.append(Case(f"min_length/{beam}/min_4", "min_length",
                          {"beam_size": beam, "n_best": beam, "max_length": 6, "min_length": 4}))
        found.append(Case(f"min_length/{beam}/good_endings", "min_length",
                          {"beam_size": beam, "max_length": 6, "suppress_bad_endings": True}))
    for beam in (1, 3):  # the favourite caption is "a": one word, a bad ending
        found.append(Case(f"first_word/{beam}/plain", "first_word", {"beam_size": beam, "max_length": 4}))
        found.append(Case(f"first_word/{beam}/good_endings", "first_word",
                          {"beam_size": beam, "n_best": beam, "max_length": 4, "suppress_bad_endings": True}))
    for beam in (1, 3):  # <eos> banned: no caption can end
        found.append(Case(f"endless/{beam}", "endless", {"beam_size": beam, "n_best": beam, "max_length": 5},
                          banned=(PAD, BOS, UNK, EOS), bad_endings=()))
    for label, options in (("greedy", {"beam_size": 1}),
                           ("beam_3", {"beam_size": 3, "n_best": 3, "length_penalty": 1.0}),
                           ("beam_2_trigrams", {"beam_size": 2, "block_trigrams": True})):
        found.append(Case(f"batch/{label}", "batch", {"max_length": 7, **options}, alone=True))
    found.append(Case("diverse/one_group", "diverse", {"beam_size": 4, "n_best": 4, "max_length": 6}))
    for label, options in (
        ("greedy", {"beam_size": 1}),
        ("greedy_rules", {"beam_size": 1, "block_trigrams": True, "min_length": 3, "suppress_bad_endings": True}),
        ("beam_3", {"beam_size": 3, "n_best": 3}),
        ("beam_4_alpha", {"beam_size": 4, "n_best": 2, "length_penalty": 0.8, "block_trigrams": True}),
        ("beam_5_rules", {"beam_size": 5, "n_best": 5, "min_length": 2, "suppress_bad_endings": True,
                          "length_penalty": 2.0}),
        ("beam_3_short", {"beam_size": 3, "max_length": 2}),
    ):
        found.append(Case(f"agree/{label}", "agree", {"max_length": 8, **options}))
    found.append(Case("ties/greedy", "ties", {"beam_size": 1, "max_length": 4}))
    found.append(Case("ties/beam", "ties", {"beam_size": 2, "n_best": 2, "max_length": 4}))
    return found


# Searches that must refuse: more hypotheses than beams.
REFUSALS = [Case(f"refusal/{search}", "greedy", {"beam_size": 2, "max_length": 5}, search, extra={"n_best": 3})
            for search in ("beam", "decode")]


def search_arguments(case: Case) -> tuple[SearchOptions, TokenRules, int]:
    """The numpy search's options, rules and n_best for `case`, its options checked as the library does."""
    options = DecodeOptions(**case.options)
    rules = TokenRules(BOS, EOS, np.isin(np.arange(V), case.banned), np.isin(np.arange(V), case.bad_endings))
    return SearchOptions(**{name: getattr(options, name) for name in SEARCH_FIELDS}), rules, options.n_best


def lookup_step(tables: Tables) -> numpy_search.StepFunction:
    """The numpy step of `tables`: memory {"image"} (R,), state {"steps", "image"} (R,) each, int64;
    the state's image must still be the memory's (a gather of the wrong rows would move it)."""

    def step(memory: dict, prev: np.ndarray, state: dict) -> tuple:
        image, steps = memory["image"], state["steps"]
        assert np.array_equal(state["image"], image), "the state's rows left their image"
        attn = tables.attn[image, prev][:, None, None, :]  # (R, 1, 1, N)
        return tables.logprobs[image, steps, prev], attn, {"steps": steps + 1, "image": state["image"]}

    return step


def numpy_results(case: Case, tables: Tables, n_best: int | None = None) -> tuple[list[list], int]:
    """What the numpy search returns for `case` on `tables` (all its images): per image its
    hypotheses, and the steps it ran."""
    options, rules, default_n_best = search_arguments(case)
    images = np.arange(len(tables.attn), dtype=np.int64)  # (B,)
    memory, state = {"image": images}, {"steps": np.zeros_like(images), "image": images.copy()}
    search = numpy_search.beam_search_n_best if case.search == "beam" else numpy_search.decode_hypotheses
    step, calls = lookup_step(tables), []
    counted = lambda *arguments: calls.append(1) or step(*arguments)  # noqa: E731
    ranked = search(counted, memory, state, rules, options, default_n_best if n_best is None else n_best)
    return ranked, len(calls)


def float32s(values: np.ndarray | float) -> list[float] | float:
    """float32 values as the doubles of their shortest decimals, which read back to the same float32."""
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    out = []
    for x in flat:  # numpy float32 scalars: str() gives the shortest decimal
        assert np.isfinite(x), "JSON holds finite numbers only"
        short = float(str(x))
        out.append(short if np.float32(short) == x else float(x))
    return out if np.ndim(values) else out[0]


def hypothesis_json(h: numpy_search.Hypothesis) -> dict:
    return {"tokens": h.tokens, "finished": h.finished, "score": h.score, "logprob": float32s(h.logprob),
            "attn": float32s(h.attn)}


def case_json(case: Case, tables: Tables) -> dict:
    """A case as the file holds it, with its expected result: per image its hypotheses, best first."""
    options, rules, n_best = search_arguments(case)
    expected, steps = numpy_results(case, tables)
    return {"name": case.name, "tables": case.tables, "search": case.search, "steps": steps,
            "bos": BOS, "eos": EOS, "banned": list(case.banned), "bad_endings": list(case.bad_endings),
            "options": {name: getattr(options, name) for name in SEARCH_FIELDS}, "n_best": n_best,
            "alone": case.alone, "expected": [[hypothesis_json(h) for h in hyps] for hyps in expected]}


def refusal_json(case: Case, tables: Tables) -> dict:
    """A search that must refuse, with the numpy search's message."""
    options, _, _ = search_arguments(case)
    try:
        numpy_results(case, tables, n_best=case.extra["n_best"])
    except ConfigError as error:
        message = str(error)
    else:
        raise AssertionError(f"{case.name}: the numpy search did not refuse")
    return {"name": case.name, "tables": case.tables, "search": case.search, "bos": BOS, "eos": EOS,
            "banned": list(case.banned), "bad_endings": list(case.bad_endings),
            "options": {name: getattr(options, name) for name in SEARCH_FIELDS}, "n_best": case.extra["n_best"],
            "error": message}


def build() -> dict:
    """The whole file's content."""
    tables = {name: Tables.of(spec) for name, spec in TABLE_SETS.items()}
    return {
        "about": "The search conformance cases of tests/search_cases.py (tables: base64 of little-endian float32, "
                 f"row-major). Do not edit: rewrite with `{REWRITE}`.",
        "words": list(WORDS),
        "tables": {name: t.as_json() for name, t in tables.items()},
        "cases": [case_json(case, tables[case.tables]) for case in cases()],
        "refusals": [refusal_json(case, tables[case.tables]) for case in REFUSALS],
    }


def render(data: dict) -> str:
    """The file's text: one line per table set, case and refusal."""
    dump = lambda value: json.dumps(value, separators=(",", ":"), allow_nan=False)  # noqa: E731
    tables = ",\n".join(f"{dump(name)}:{dump(value)}" for name, value in data["tables"].items())
    lines = [f'{{"about":{dump(data["about"])},', f'"words":{dump(data["words"])},', f'"tables":{{\n{tables}}},',
             '"cases":[', ",\n".join(dump(case) for case in data["cases"]) + "],",
             '"refusals":[', ",\n".join(dump(case) for case in data["refusals"]) + "]}"]
    return "\n".join(lines) + "\n"


def load() -> dict:
    return json.loads(PATH.read_text())


if __name__ == "__main__":
    PATH.write_text(render(build()))
    print(f"wrote {PATH} ({PATH.stat().st_size // 1024} KiB)")
