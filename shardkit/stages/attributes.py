"""Scores as attribute columns: documents through the scorers of stages.filters into Arrow columns,
plus the keep/drop decision `--filter` takes from the same scores."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

import numpy as np

from shardkit.errors import ConfigError
from shardkit.config.build import MAX_DOC_BYTES
from shardkit.stages.filters import FILTERS, text_bytes

log = logging.getLogger(__name__)

# Attribute column types, by the name the manifest records (pyarrow's own str() is ambiguous:
# float32 prints as "float"). A scorer declares its columns with these types.
TYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
              "float64", "string")
# Columns the dedup step fills (build --dedup --annotate), not a scorer: `exact_dup` a copy of an
# earlier sample's content, `duplicate` what --dedup would remove (exact or near), and
# `near_dup_cluster` its cluster (null outside one: see jobs/build.py).
DEDUP_COLUMNS = {"exact_dup": "bool", "duplicate": "bool", "near_dup_cluster": "int64"}
DEDUP = "dedup"  # the name they are recorded under, as a scorer's columns are under its name
RESERVED = ("__key__",)


def arrow_type(name: str):
    """The pyarrow type of a recorded type name."""
    import pyarrow as pa

    return {"bool": pa.bool_(), "float32": pa.float32(), "float64": pa.float64(),
            "string": pa.string()}.get(name) or getattr(pa, name)()


def type_name(t) -> str:
    """The recorded name of a pyarrow type; ConfigError for a type attribute tables do not hold."""
    for name in TYPE_NAMES:
        if arrow_type(name) == t:
            return name
    raise ConfigError(f"attribute type {t} is not one of {', '.join(TYPE_NAMES)}: declare the scorer's columns "
                      "with one of them")


def make_scorers(names, options: dict | None = None) -> list:
    """Scorers by name (a comma-separated string or a list), each built by FILTERS[name](**options[name]),
    in the order given; checks their columns (known types, no name twice)."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    names = list(dict.fromkeys(names))
    bad = [n for n in names if n not in FILTERS]
    if bad or not names:
        raise ConfigError(f"scorers {bad or names!r}: expected a comma-separated list of {', '.join(sorted(FILTERS))} "
                          "(--filter / --scorers)")
    return check_columns([FILTERS[n](**(options or {}).get(n, {})) for n in names])


def check_columns(scorers: list) -> list:
    """The scorers, once their columns are checked: known types, no column twice (nor one the dedup
    step or shardkit fills)."""
    seen: dict[str, str] = {c: "the dedup step" for c in DEDUP_COLUMNS}
    seen.update({c: "shardkit" for c in RESERVED})
    for s in scorers:
        for col, t in s.columns.items():
            type_name(t)
            if col in seen:
                raise ConfigError(f"scorer {s.name!r} declares column {col!r}, which {seen[col]} fills already")
            seen[col] = repr(s.name)
    return scorers


def fingerprint(scorer) -> str:
    """What identifies a scorer's values: its name, options (a frozen dataclass's repr lists them)
    and column types. Stored with each attribute table, so a rerun scores again only what changed."""
    cols = ",".join(f"{c}:{type_name(t)}" for c, t in scorer.columns.items())
    return hashlib.sha256(f"{scorer.name}|{scorer!r}|{cols}".encode()).hexdigest()[:16]


@dataclass
class Scores:
    """One batch of documents scored: attribute columns, what `keep` decided, what could not be scored."""

    columns: dict  # column -> pyarrow array
    keep: np.ndarray  # bool per document: every scorer's keep() said yes
    rules: list  # the first refusing rule per document (None where kept)
    failed: dict = field(default_factory=dict)  # scorer -> documents it raised on (scores null, kept)


def score_texts(texts: list, scorers: list, max_bytes: int | None = MAX_DOC_BYTES) -> Scores:
    """Every document through the scorers, in order: each sees the text the previous one left (a
    scorer with `edit(text)` changes it: dropped lines, masked addresses), as a build's filters run.
    A bool column a scorer declares but its `score` leaves out is its verdict, `keep`'s answer.
    A document without text gets null scores and is kept; one a scorer raises on gets that scorer's
    columns null, is kept and is counted in `failed` (a scorer's bug or a document it cannot read
    must not stop a build). A text over `max_bytes` is not scored (the filters would hold several
    copies of it): null scores, kept, counted in `failed` for every scorer."""
    import pyarrow as pa

    n = len(texts)
    keep, rules, failed = np.ones(n, bool), [None] * n, {}
    values = {c: [None] * n for s in scorers for c in s.columns}
    for i, text in enumerate(texts):
        if text is not None and max_bytes is not None and text_bytes(text) > max_bytes:
            log.warning("a document of %d bytes is over %d: not scored (its columns are null)", text_bytes(text),
                        max_bytes)
            for scorer in scorers:
                failed[scorer.name] = failed.get(scorer.name, 0) + 1
            continue
        for scorer in scorers if text is not None else ():
            try:
                row, ok, rule = _one(scorer, text)
                text = scorer.edit(text) if hasattr(scorer, "edit") else text
            except Exception as e:  # noqa: BLE001 — counted per scorer, logged once, never fatal
                if not failed.get(scorer.name):
                    log.warning("scorer %s failed on a document (%s: %s); its scores are null", scorer.name,
                                type(e).__name__, e)
                failed[scorer.name] = failed.get(scorer.name, 0) + 1
                continue
            for c, v in row.items():
                values[c][i] = v
            if not ok and keep[i]:
                keep[i], rules[i] = False, rule
    types = {c: t for s in scorers for c, t in s.columns.items()}
    return Scores({c: pa.array(v, types[c]) for c, v in values.items()}, keep, rules, failed)


def _one(scorer, text: str) -> tuple[dict, bool, str | None]:
    """(a value for each of the scorer's columns, kept, rule) of one text."""
    import pyarrow as pa

    scores = scorer.score(text)
    ok, rule = scorer.keep(scores)
    row = {}
    for c, t in scorer.columns.items():
        if c in scores:
            row[c] = scores[c]
        elif t == pa.bool_():  # the verdict, which score() may leave to keep()
            row[c] = ok
        else:
            raise KeyError(f"{scorer.name}.score() gave no value for its column {c!r}")
    return row, ok, rule
