"""Filter options: their kinds read from the filters' declarations, one spelling of "off" (None), and the
range checks every value passes (a NaN threshold compares false: the rule would be silently off)."""

from __future__ import annotations

import dataclasses
import math

OFF_WORDS = ("none", "off")  # what --filter-option VALUE turns a limit (or a rule's flag) off with


def parse_grams(value) -> tuple[tuple[int, float], ...]:
    """'2:0.2,3:0.18' or ((2, 0.2), (3, 0.18)) -> ((2, 0.2), (3, 0.18))."""
    if isinstance(value, str):
        value = [p.split(":") for p in value.split(",") if p.strip()]
    return tuple((int(n), float(x)) for n, x in value)


def kind(cls, option: str) -> str:
    """'text' (a path, a label), 'flag', 'words' (a list of words), 'pairs' (n-gram: fraction), 'float' or 'int', from the field's
    declared type (`min_avg_word_length: float | None = 3` is a float, though its default is an int)."""
    declared = str({f.name: f.type for f in dataclasses.fields(cls)}[option])
    if declared.startswith("str"):
        return "text"
    if declared.startswith("bool"):
        return "flag"
    if declared.startswith("tuple[str"):
        return "words"
    if declared.startswith("tuple"):
        return "pairs"
    return "float" if "float" in declared else "int"


def parse(cls, option: str, text: str):
    """An option's value from its --filter-option text; ValueError says what was expected."""
    low, what = text.strip().lower(), kind(cls, option)
    if low in OFF_WORDS:
        return False if what == "flag" else None
    if what == "flag":
        if low not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError("expected true or false (or none: off)")
        return low in ("true", "1", "yes")
    if what == "text":
        return text.strip()
    if what == "words":
        return tuple(w.strip() for w in text.split(",") if w.strip())
    if what == "pairs":
        return text  # '2:0.2,3:0.18', parsed and checked by the filter
    try:
        return float(text) if what == "float" else int(text)
    except ValueError:
        raise ValueError(f"expected a value like {_default(cls, option)!r} (a{'' if what == 'float' else 'n integer'} "
                         "number, or none: off)") from None


def _default(cls, option: str):
    return {f.name: f.default for f in dataclasses.fields(cls)}[option]


def settled(cls, option: str, value):
    """The value with a legacy spelling of off (C4's -1, Gopher's 0: `OFF`) and an empty list as None
    or (); flags and other values as they are."""
    if value is not None and not isinstance(value, bool) and value == getattr(cls, "OFF", {}).get(option, object()):
        return None
    if value is None and kind(cls, option) in ("words", "pairs"):
        return ()
    return value


def problem(cls, option: str, value) -> str | None:
    """What is wrong with a (settled) value: NaN or infinity, a fraction outside [0, 1], a negative
    count; None when it is fine."""
    what = kind(cls, option)
    if value is None or what in ("text", "flag", "words"):
        return None
    if what == "pairs":
        try:
            grams = parse_grams(value)
        except (TypeError, ValueError):
            return "pairs N:FRACTION, e.g. 2:0.2,3:0.18"
        bad = [f"{n}:{x}" for n, x in grams if n < 1 or not 0.0 <= x <= 1.0]  # NaN fails the comparison too
        return f"pairs N:FRACTION with N >= 1 and a fraction in [0, 1], not {', '.join(bad)}" if bad else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"a number, not {type(value).__name__}"
    if not math.isfinite(value):
        return "a finite number"
    if option in getattr(cls, "FRACTIONS", ()) and not 0.0 <= value <= 1.0:
        return "a fraction in [0, 1]"
    if value < 0:
        return "a count >= 0" if what == "int" else "a number >= 0"
    return None


def settle(obj) -> None:
    """A filter's __post_init__: its options settled (off as None) and checked; one ValueError names
    every bad option."""
    cls, bad = type(obj), []
    for f in dataclasses.fields(obj):
        value = settled(cls, f.name, getattr(obj, f.name))
        object.__setattr__(obj, f.name, value)
        if (why := problem(cls, f.name, value)) is not None:
            bad.append(f"{obj.name}.{f.name}={value!r} (expected {why})")
    if bad:
        raise ValueError(f"out of range: {'; '.join(bad)}; none turns a limit off")
