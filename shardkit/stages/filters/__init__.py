"""Document scorers and curation filters: quality rules (Gopher, C4, FineWeb), language identification,
PII masking and a text-length rule, each an object built from its options (registry: FILTERS).

Every filter is a `Filter` (base.py, a Protocol): `name`, `decides`, `verdict`, `columns` ({column:
pyarrow type}: its signals and, where it has one, its bool verdict column), `score(text)` (its signals:
pure, deterministic: the same text gives the same values in any process), `keep(scores) -> (kept, rule
or None)`, `check(text)` (the same verdict, stopping at the first rule that rejects) and `edit(text)`
(the text the next step sees: C4 keeps only its kept lines, PII masks addresses; the others return it
unchanged). Its options are frozen dataclass fields; None is "off" for every limit (limits.py).
`build --filter` runs them in a fixed order per text (Curation) and drops what they refuse;
`build --annotate` and `shardkit annotate` store the values as attribute columns instead, so that
`where=` can choose at training time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shardkit.contract import decode_text
from shardkit.config.build import MAX_DOC_BYTES
from shardkit.errors import BadOption, ConfigError
from shardkit.stages.filters import limits
from shardkit.stages.filters.base import Filter
from shardkit.stages.filters.c4 import C4, FineWeb
from shardkit.stages.filters.classifier import FastText
from shardkit.stages.filters.gopher import GopherQuality, GopherRepetition
from shardkit.stages.filters.lang import Lang
from shardkit.stages.filters.length import TextLength
from shardkit.stages.filters.pii import PII

FILTERS: dict[str, type[Filter]] = {"gopher-quality": GopherQuality, "gopher-repetition": GopherRepetition,
                                    "c4": C4, "fineweb": FineWeb, "lang": Lang, "pii": PII, "text-length": TextLength,
                                    "fasttext": FastText}
TOO_LARGE = "too-large"  # the counters' and filtered list's name for a text over --filter-max-bytes
STAT = "curation"  # prefix of the build's stat counters: curation.<filter>.<rule>, curation.pii.<kind>
# and the volume the filters saw and removed (the share of the corpus, hence of training compute, saved):
VOLUME = (f"{STAT}.input.documents", f"{STAT}.input.bytes", f"{STAT}.bytes.")  # the last + <filter>
TOKENS = (f"{STAT}.input.tokens", f"{STAT}.tokens.")  # with a tokenizer: the same in tokens (the last + <filter>)


def _split(items) -> list[str]:
    """Each --filter-option value cut before every `,NAME.OPTION=`: several options in one flag
    (fasttext.model=m.bin,fasttext.label=__label__hq), while commas inside a value stay
    (gopher-repetition.top_n_grams=2:0.2,3:0.18)."""
    import re

    return [part for item in items for part in re.split(r",(?=[a-z0-9-]+\.[a-z0-9_]+=)", str(item))]


def parse_options(items) -> dict[str, dict]:
    """('gopher-quality.min_doc_words=30', ...) -> {'gopher-quality': {'min_doc_words': 30}}; every value
    parsed and range-checked, and one ConfigError names every bad one (`fineweb.line_punct_thr=nan`)."""
    out: dict = {}
    bad = []
    for item in _split(items):
        head, sep, text = str(item).partition("=")
        name, dot, option = head.strip().partition(".")
        if not sep or not dot:
            raise BadOption(f"--filter-option {item!r}: expected FILTER.OPTION=VALUE, e.g. "
                              "gopher-quality.min_doc_words=30")
        cls = FILTERS.get(name)
        if cls is None:
            raise BadOption(f"--filter-option {item!r}: no filter {name!r}; choose one of {', '.join(FILTERS)}")
        fields = [f.name for f in dataclasses.fields(cls) if f.init]
        if option not in fields:
            raise BadOption(f"--filter-option {item!r}: {name} has no option {option!r}; its options: "
                              f"{', '.join(fields)}")
        try:
            value = limits.settled(cls, option, limits.parse(cls, option, text))
        except ValueError as e:
            bad.append(f"{head.strip()}={text} ({e})")
            continue
        if (why := limits.problem(cls, option, value)) is not None:
            bad.append(f"{head.strip()}={text} (expected {why})")
        out.setdefault(name, {})[option] = value
    if bad:
        raise BadOption(f"--filter-option: {'; '.join(bad)}; none turns a limit off")
    return out


def make_filter(name: str, options: dict | None = None):
    """FILTERS[name] built from its options; a ConfigError names a bad filter, option or value."""
    if name not in FILTERS:
        raise ConfigError(f"--filter {name!r}: no such filter; choose among {', '.join(FILTERS)}")
    try:
        return FILTERS[name](**(options or {}))
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"--filter-option for {name}: {e}") from None


@dataclass(frozen=True)
class Curation:
    """The filters a build runs, in order: language first (the cheapest reject), then the quality
    filters as given, PII masking last (it edits what is kept, never decides)."""

    steps: tuple[Filter, ...]
    max_bytes: int | None = MAX_DOC_BYTES  # a larger text is removed as too-large, never given to the filters

    @classmethod
    def from_options(cls, names, options=(), lang=None, lang_threshold=0.65, mask_pii=False,
                     max_bytes: int | None = MAX_DOC_BYTES) -> "Curation":
        """The build's curation from its flags (--filter, --filter-option, --lang, --lang-threshold, --mask-pii,
        --filter-max-bytes)."""
        wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names or ()) if n.strip()]
        opts = parse_options(options)
        if lang:
            opts.setdefault("lang", {}).update(languages=lang, threshold=lang_threshold)
            wanted.append("lang")
        if mask_pii:
            wanted.append("pii")
        last = {n for n in wanted if not getattr(FILTERS.get(n), "decides", True)}  # they edit what is kept (PII)
        order = sorted(dict.fromkeys(wanted), key=lambda n: (n != "lang", n in last, wanted.index(n)))
        unused = sorted(set(opts) - set(order))
        if unused:
            raise ConfigError(f"--filter-option for {', '.join(unused)}, which is not run: add it to --filter")
        return cls(tuple(make_filter(n, opts.get(n)) for n in order), max_bytes)

    def __bool__(self) -> bool:
        return bool(self.steps)

    def record(self) -> dict:
        """Every filter's options in effect (defaults included): part of the build's fingerprint."""
        return {f.name: {k: v for k, v in dataclasses.asdict(f).items()} for f in self.steps}

    @property
    def columns(self) -> dict:
        """Every step's attribute columns, in order (what `annotate` returns a value for)."""
        return {k: v for f in self.steps for k, v in f.columns.items()}

    def annotate(self, text: str) -> tuple[str, dict]:
        """(the text as edited, every column's value): each step scores the text the previous one
        left, and its verdict is stored beside its signals; nothing is removed."""
        row: dict = {}
        for f in self.steps:
            scores = f.score(text)
            row.update(scores)
            if f.verdict is not None and f.verdict not in scores:
                row[f.verdict] = f.keep(scores)[0]
            text = f.edit(text)
        return text, row

    def apply(self, text: str, stats: dict) -> tuple[str, tuple[str, str] | None]:
        """(the text as edited, None) or (text, (filter, rule)) for a rejected one; counts into stats."""
        for f in self.steps:
            if not f.decides:  # it only counts what it masks (PII): its scores are the counters
                for column, n in f.score(text).items():
                    if n:
                        stats[f"{STAT}.{column.replace('_', '.', 1)}"] = stats.get(
                            f"{STAT}.{column.replace('_', '.', 1)}", 0) + n
            else:
                kept, rule = f.check(text)
                if not kept:
                    key = f"{STAT}.{f.name}.{rule}"
                    stats[key] = stats.get(key, 0) + 1
                    return text, (f.name, rule)
            text = f.edit(text)
        return text, None


def rejections_by_filter(stats: dict) -> dict[str, dict[str, int]]:
    """{filter: {rule: documents removed}} of a build's counters: the filters' own counts, without
    PII masking, the volumes, and --dedup-paragraphs (which runs before the filters, on paragraphs)."""
    removed: dict = {}
    for key, n in stats.items():
        parts = key.split(".")
        if parts[0] == STAT and parts[1] not in ("pii", "input", "bytes", "tokens", "dedup-paragraphs"):
            removed.setdefault(parts[1], {})[parts[2]] = n
    return removed


def text_bytes(value) -> int:
    """A text's size in UTF-8 bytes, counted without a copy of it."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if value.isascii():
        return len(value)
    return sum(len(value[i:i + (1 << 20)].encode("utf-8", "replace")) for i in range(0, len(value), 1 << 20))


def curate(samples, *, curation: Curation, stats: dict, dropped: list, count=None):
    """Stage: run the curation over each sample's text; a rejected sample is counted and listed in
    `dropped` as (key, source, source row, filter, rule), and left out. Samples without text pass.
    A text over `curation.max_bytes` is removed as (TOO_LARGE, 'max_bytes') before it is decoded: the
    filters hold several copies of a text (lines, words, n-gram arrays): 0.7-0.8 GB for a 50 MB one
    (bench/RESULTS.md). `count(text) -> tokens` (a build with a tokenizer): each text's tokens as it
    came in, counted into TOKENS (all, and per filter what it removed), so kept + removed = the input's
    tokens; a too-large text is not tokenized (that would hold it again) and counts 0 tokens on both sides."""
    for sample in samples:
        value = sample.fields.get("txt")
        if value is None:
            yield sample
            continue
        size = text_bytes(value)
        for key, n in ((VOLUME[0], 1), (VOLUME[1], size)):
            stats[key] = stats.get(key, 0) + n
        tokens = 0
        if curation.max_bytes is not None and size > curation.max_bytes:
            rejected = (TOO_LARGE, "max_bytes")
        else:
            text, _ = decode_text(value)
            if count is not None:
                tokens = count(text)
                stats[TOKENS[0]] = stats.get(TOKENS[0], 0) + tokens
            edited, rejected = curation.apply(text, stats)
        if rejected is not None and rejected[0] == TOO_LARGE:
            key = f"{STAT}.{TOO_LARGE}.max_bytes"
            stats[key] = stats.get(key, 0) + 1
        if rejected is not None:
            stats[VOLUME[2] + rejected[0]] = stats.get(VOLUME[2] + rejected[0], 0) + size
            if count is not None:
                stats[TOKENS[1] + rejected[0]] = stats.get(TOKENS[1] + rejected[0], 0) + tokens
            meta = sample.meta
            dropped.append((sample.key, meta.get("source_path"), meta.get("source_row"), *rejected))
            continue
        if edited != text:
            sample.fields["txt"] = edited
        yield sample
