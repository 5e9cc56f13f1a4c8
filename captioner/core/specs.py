"""What a setting may hold: `Range`, `Choice`, `Text`, `Place` and `Flag`.

Each allows a value, describes it in words, and gives one just outside (for tests).
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    """A number's allowed interval: `Range(ge=0, lt=1)` is [0, 1). Floats must also be finite."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def allows(self, value: Any) -> bool:
        if value is None:  # only reachable for `int | None` and `float | None` keys: None means "not set"
            return True
        if isinstance(value, float) and not math.isfinite(value):
            return False
        bounds = ((self.ge, operator.ge), (self.gt, operator.gt), (self.le, operator.le), (self.lt, operator.lt))
        return all(bound is None or test(value, bound) for bound, test in bounds)

    def describe(self) -> str:
        low = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else None
        high = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>=' if self.ge is not None else '>'} {low[1:]}"
        if high:
            return f"{'<=' if self.le is not None else '<'} {high[:-1]}"
        return "a finite number"

    def outside(self, kind: type) -> Any:
        """A value of `kind` just outside the interval (for tests)."""
        step = 1 if kind is int else 0.5
        for bound, shift in ((self.ge, -step), (self.gt, 0), (self.le, step), (self.lt, 0)):
            if bound is not None:
                return kind(bound + shift)
        return None


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of values."""

    options: tuple[Any, ...]

    def allows(self, value: Any) -> bool:
        return value in self.options

    def describe(self) -> str:
        return f"one of {', '.join(map(str, self.options))}"

    def outside(self, kind: type) -> Any:
        return kind(max(self.options) + 1) if kind is int else "no-such-" + str(self.options[0])


@dataclass(frozen=True)
class Text:
    """A string: a path or a name; `pattern` (a full match) when only some strings make sense."""

    pattern: str | None = None
    allowed: str = "a non-empty string"  # how the error message describes the pattern

    def allows(self, value: Any) -> bool:
        if value is None:  # only reachable for `str | None` keys: None means "not set"
            return True
        return re.fullmatch(self.pattern, value) is not None if self.pattern is not None else value.strip() != ""

    def describe(self) -> str:
        return self.allowed

    def outside(self, kind: type) -> Any:
        return "no such value!" if self.pattern is not None else ""


@dataclass(frozen=True)
class Place(Text):
    """A path, folder or shard pattern on the machine. A model carries of it (`core/portable_config.py`),
    by `travels`: "name", its last component; "run", the run folder's name; "null", nothing."""

    travels: str = "null"


@dataclass(frozen=True)
class Flag:
    """true or false: the type check is all there is."""

    def allows(self, value: Any) -> bool:
        return isinstance(value, bool)

    def describe(self) -> str:
        return "true or false"

    def outside(self, kind: type) -> Any:
        return None


Spec = Range | Choice | Text | Place | Flag


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
