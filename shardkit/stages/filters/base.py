"""What every curation filter shares: signals computed in the order its rules check them, a
verdict from the signals alone, and an early-stopping check for builds that keep no attributes."""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import pyarrow as pa

from shardkit.stages.filters import limits

F64, I32 = pa.float64(), pa.int32()


def ratio(a: float, b: float) -> float:
    """a / b, or 0 for an empty denominator (where datatrove would divide by zero)."""
    return a / b if b else 0.0


def over(limit, value) -> bool:
    """A maximum that rejects; a limit of None is off (datatrove's 0 is read as None: limits.settled)."""
    return limit is not None and value > limit


def under(limit, value) -> bool:
    """A minimum that rejects; a limit of None is off."""
    return limit is not None and value < limit


@runtime_checkable
class Filter(Protocol):
    """What `build --filter`, `build --annotate` and `shardkit annotate` ask of a curation filter. Its
    options are the fields of a frozen dataclass, checked by limits.settle (None: a limit is off)."""

    name: str  # the registry's name; the counters are curation.<name>.<rule>
    decides: bool  # False: it never rejects, only counts what it edits (PII); score() gives those counts
    verdict: str | None  # its bool column that keep() fills (score() leaves it out), or None

    @property
    def columns(self) -> dict: ...  # {column: pyarrow type}: what annotating stores

    def score(self, text: str) -> dict: ...  # its signals: a pure function of the text and the options

    def keep(self, scores: dict) -> tuple[bool, str | None]: ...  # (kept, the rule that rejects)

    def check(self, text: str) -> tuple[bool, str | None]: ...  # keep(score(text)), stopping early

    def edit(self, text: str) -> str: ...  # the text the next filter sees


class RuleFilter:
    """Base of the rule-based filters. A subclass defines `name`, `signals()`, `_steps(text)` (yields
    (signal, value) in rule order) and `_rules(s)` (yields (signal, rule, rejects) with `rejects()`
    reading the signals dict s). Options are the subclass's dataclass fields."""

    name: ClassVar[str] = ""
    decides: ClassVar[bool] = True
    SIGNALS: ClassVar[dict] = {}
    FRACTIONS: ClassVar[frozenset] = frozenset()  # options that are fractions, in [0, 1]
    OFF: ClassVar[dict] = {}  # option -> an old spelling of off (C4's -1, datatrove's 0), read as None

    def __post_init__(self):
        limits.settle(self)

    @property
    def prefix(self) -> str:
        return self.name.replace("-", "_")

    @property
    def verdict(self) -> str | None:
        return self.prefix

    def signals(self) -> dict:
        return dict(self.SIGNALS)

    @property
    def columns(self) -> dict:
        """Attribute columns: `<prefix>_<signal>` for each signal, then the verdict `<prefix>` (bool)."""
        cols = {f"{self.prefix}_{k}": v for k, v in self.signals().items()}
        cols[self.prefix] = pa.bool_()
        return cols

    def score(self, text: str) -> dict:
        """Every signal of the text (a pure function of the text and the options)."""
        return {f"{self.prefix}_{k}": v for k, v in self._steps(text)}

    def keep(self, scores: dict) -> tuple[bool, str | None]:
        """(kept, None) or (False, the first rule that rejects), from score()'s values alone."""
        cut = len(self.prefix) + 1
        plain = {k[cut:]: v for k, v in scores.items() if k.startswith(self.prefix + "_")}
        for _, rule, rejects in self._rules(plain):
            if rejects():
                return False, rule
        return True, None

    def check(self, text: str) -> tuple[bool, str | None]:
        """keep(score(text)), computing signals only until a rule rejects."""
        s: dict = {}
        rules = list(self._rules(s))
        i = 0
        for name, value in self._steps(text):
            s[name] = value
            while i < len(rules) and rules[i][0] in s:
                if rules[i][2]():
                    return False, rules[i][1]
                i += 1
        return True, None

    def edit(self, text: str) -> str:
        """The text the next step sees (filters that drop lines or mask spans change it)."""
        return text
