"""The decoding options, declared once: type, default, allowed values, the demo's narrower range, meaning.

The config, the library, the flags, the demo and the ONNX runtime all check options here, so a bad value
gets the same words wherever it is given ("beam_size must be a whole number in [1, 100]; got 0").
"""

from __future__ import annotations

import argparse
import difflib
import math
import numbers
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from captioner.core.errors import ConfigError
from captioner.core.specs import Range

KIND_WORDS = {bool: "true or false", int: "a whole number", float: "a finite number"}


@dataclass(frozen=True)
class DecodeOption:
    """One decoding option; also a config spec (`allows`, `describe`, `outside`), so the config's
    `decode` keys are declared with it and refused in the same words."""

    name: str
    kind: type  # bool, int or float
    default: Any
    meaning: str
    limits: Range | None = None  # numbers: the interval every caller may use
    # numbers: the interval a public demo request may use (one request must not hold the server)
    served: Range | None = None
    optional: bool = False  # None allowed: not set

    def allows(self, value: Any, served: bool = False) -> bool:
        if value is None:
            return self.optional
        if self.kind is bool:
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return False
        if self.kind is int and value != int(value):  # 3.0 (a slider's, JSON's) is the whole number 3
            return False
        limits = self.served if served and self.served is not None else self.limits
        return limits is None or limits.allows(value)

    def describe(self, served: bool = False) -> str:
        """What the option takes, in words: "a whole number in [1, 100]"."""
        words = KIND_WORDS[self.kind]
        limits = self.served if served and self.served is not None else self.limits
        if limits is not None:
            words += " " + limits.describe()
        return words + (", or null" if self.optional else "")

    def refusal(self, value: Any, served: bool = False) -> str:
        """The one text for a bad value, without the place it came from."""
        return f"{self.name} must be {self.describe(served)}; got {value!r}"

    def check(self, value: Any, served: bool = False) -> Any:
        """`value` converted, or a ConfigError "decode: <refusal>"; `served`: the demo's narrower range."""
        if not self.allows(value, served):
            raise ConfigError(f"decode: {self.refusal(value, served)}")
        return self.converted(value)

    def argument_type(self) -> Callable[[str], Any]:
        """The option as an argparse `type`: a command line's text as the option's kind, checked; the
        refusal (without "decode:") becomes argparse's one-line error."""

        def parse(text: str) -> Any:
            try:
                value = int(text) if self.kind is int else float(text)
            except ValueError:
                value = text  # not a number: refused below, as written
            if not self.allows(value):
                raise argparse.ArgumentTypeError(self.refusal(value))
            return self.converted(value)

        parse.__name__ = self.name  # argparse's "invalid <type> value" names it
        return parse

    def converted(self, value: Any) -> Any:
        """An allowed value as the option's type: 3.0 -> 3 for whole numbers."""
        if value is None or self.kind is bool:
            return value
        return int(value) if self.kind is int else float(value)

    def outside(self, kind: type) -> Any:
        """A value just outside the limits (for tests); None when there are none (true/false)."""
        return None if self.limits is None else self.limits.outside(self.kind)


WORDS = Range(ge=1, le=1000)  # a caption's length in words
OPTIONS: dict[str, DecodeOption] = {option.name: option for option in (
    DecodeOption("beam_size", int, 3, "beams per image; 1 decodes greedily", Range(ge=1, le=100),
                 served=Range(ge=1, le=10)),
    DecodeOption("max_length", int, 30, "words per caption at most", WORDS, served=Range(ge=1, le=60)),
    # GNMT's alpha is about 0.6-1; past 10 it only ranks by length, and past about 138 the penalty overflows a float
    DecodeOption("length_penalty", float, 0.0,
                 "alpha of ((5 + length) / 6) ** alpha; 0 ranks by total log-probability", Range(ge=0, le=10)),
    DecodeOption("block_trigrams", bool, False, "never repeat a word trigram within a caption"),
    DecodeOption("min_length", int, 0, "words before `<eos>` is allowed (every mode)", Range(ge=0, le=1000)),
    DecodeOption("suppress_bad_endings", bool, False,
                 'no `<eos>` right after "a", "with", "of", ... (text/vocab.py)'),
    DecodeOption("diverse_groups", int, 1, "diverse beam search: groups of beam_size / groups beams (1: plain)",
                 Range(ge=1, le=100)),
    DecodeOption("diversity_strength", float, 0.5, "lambda of the Hamming diversity penalty between groups",
                 Range(ge=0)),
    DecodeOption("n_best", int, 1, "hypotheses per image (beam search) or draws per image (sampling)",
                 Range(ge=1, le=100)),
    DecodeOption("sample", bool, False, "draw words instead of searching"),
    DecodeOption("temperature", float, 1.0, "sampling: the softmax temperature", Range(gt=0)),
    DecodeOption("top_k", int, 0, "sampling: draw from the k most probable words only (0: all)", Range(ge=0)),
    DecodeOption("top_p", float, 1.0, "sampling: draw from the nucleus of this probability mass only",
                 Range(gt=0, le=1)),
    DecodeOption("seed", int, None, "sampling: the seed of the draws, for reproducible samples",
                 Range(ge=0, lt=2**32), optional=True),
    DecodeOption("self_attention", bool, False, "also return the decoder's self-attention weights (transformers)"),
)}


def check_names(names: Collection[str], allowed: Collection[str] = OPTIONS, where: str = "") -> None:
    """A ConfigError for the first name not `allowed` (`where`: " for the ONNX runtime"), with a hint."""
    for name in names:
        if name not in allowed:
            close = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"options: {', '.join(allowed)}"
            raise ConfigError(f"decode: unknown option {name!r}{where} ({hint})")


def check_options(values: Mapping[str, Any], served: bool = False) -> dict[str, Any]:
    """Every option in `values` checked and converted, then the rules that tie the given ones together."""
    check_names(values)
    checked = {name: OPTIONS[name].check(value, served) for name, value in values.items()}
    raise_problem(combination_problem(checked))
    return checked


def combination_problem(values: Mapping[str, Any]) -> str | None:
    """What is wrong with these valid options together, or None; with `sample` the search's rules do not apply."""
    get = values.get
    if get("min_length") is not None and get("max_length") is not None and get("min_length") > get("max_length"):
        return f"min_length ({get('min_length')}) must not exceed max_length ({get('max_length')})"
    return None if get("sample") else search_problem(values)


def search_problem(values: Mapping[str, Any]) -> str | None:
    """What is wrong with these options for a beam search (groups, n_best against the beam), or None."""
    get = values.get
    beam = get("beam_size")
    if beam is not None and get("diverse_groups") is not None and beam % get("diverse_groups"):
        return f"beam_size ({beam}) must be a multiple of diverse_groups ({get('diverse_groups')})"
    if beam is not None and get("n_best") is not None and get("n_best") > beam:
        return f"n_best ({get('n_best')}) must not exceed beam_size ({beam}); raise the beam or sample"
    return None


def check_search(values: Mapping[str, Any]) -> None:
    """The search's rules (`search_problem`) for a search about to run, as a ConfigError."""
    raise_problem(search_problem(values))


def raise_problem(problem: str | None, where: str = "decode") -> None:
    """A ConfigError "<where>: <problem>" when there is a problem (from the `*_problem` rules)."""
    if problem:
        raise ConfigError(f"{where}: {problem}")


def markdown_table() -> str:
    """The options as the docs show them (docs/library.md; a test keeps the two equal)."""
    rows = ["| option | takes | default | what it does |", "| --- | --- | --- | --- |"]
    for option in OPTIONS.values():
        takes = option.describe()
        if option.served is not None:
            takes += f" (the demo: {option.served.describe()})"
        rows.append(f"| `{option.name}` | {takes} | {option.default} | {option.meaning} |")
    return "\n".join(rows)
