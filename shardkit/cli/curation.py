"""The build's curation flags (--filter, --lang, --mask-pii, --dedup-exact) and its summary lines."""

from __future__ import annotations

import click

_OPTIONS = [
    click.option("--filter", "filter", default=None, metavar="NAMES",
                 help="Curation filters run on each text, in order: gopher-quality, gopher-repetition, c4, fineweb "
                      "(Gopher/C4/FineWeb rules at datatrove's defaults), fasttext (your own classifier: "
                      "--filter-option fasttext.model=PATH,fasttext.label=__label__hq). Removed samples are counted "
                      "per filter and rule, and listed in OUT/curation/filtered-NNNNN.parquet."),
    click.option("--filter-option", "filter_option", multiple=True, metavar="FILTER.OPTION=VALUE",
                 help="Change a threshold, e.g. gopher-quality.min_doc_words=30 or c4.min_num_sentences=3 "
                      "(none turns a limit off); repeat for more."),
    click.option("--filter-max-bytes", "filter_max_bytes", default="10MB", show_default=True, metavar="SIZE",
                 callback=lambda ctx, param, value: _max_bytes(value),
                 help="A text larger than this is not filtered (the filters hold a few copies of a text): it is "
                      "removed and counted as too-large; none: no bound."),
    click.option("--lang", default=None, metavar="CODES",
                 help="Keep texts whose language (py3langid, 97 languages) is one of these ISO 639-1 codes, "
                      "e.g. en,de."),
    click.option("--lang-threshold", type=float, default=0.65, show_default=True,
                 help="The language's probability must exceed this."),
    click.option("--mask-pii", is_flag=True, help="Replace email addresses and public IP addresses (datatrove's "
                 "PIIFormatter stand-ins), counted in the summary."),
    click.option("--dedup-exact", is_flag=True, help="Keep one of each set of texts equal after normalising (case, "
                 "punctuation, whitespace): the smallest key. Runs before --dedup; report in OUT/dedup/exact/."),
    click.option("--dedup-paragraphs", is_flag=True, help="Remove paragraphs (non-blank lines) repeated across "
                 "documents, keeping the copy in the first document in key order (dolma's paragraph dedup, "
                 "independent of order and workers). Runs after --dedup-exact, before the filters."),
]


def _max_bytes(value: str) -> int | None:
    from shardkit.config import parse_bytes
    from shardkit.errors import ConfigError

    if value is None or str(value).strip().lower() in ("none", "off"):
        return None
    try:
        return parse_bytes(value)
    except ConfigError as e:
        raise click.BadParameter(str(e)) from None


def curation_options(fn):
    """Add the curation flags to a command (each maps onto a BuildConfig field of the same name)."""
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


def curation_lines(stats: dict) -> list[str]:
    """What each curation filter removed, by rule and as a share of the documents and text bytes the
    filters saw (and, with a tokenizer, of their tokens: the training compute not spent on them), and
    what PII masking replaced."""
    from shardkit.stages.filters import rejections_by_filter

    removed = rejections_by_filter(stats)
    docs, size = stats.get("curation.input.documents", 0), stats.get("curation.input.bytes", 0)
    tokens = stats.get("curation.input.tokens", 0)  # a build with a tokenizer

    def share(n: int, nbytes: int, names=()) -> str:
        if not (docs and size):
            return ""
        removed = sum(stats.get(f"curation.tokens.{name}", 0) for name in names)
        in_tokens = f", {removed / tokens:.1%} of tokens" if tokens else ""
        return f" ({n / docs:.1%} of documents, {nbytes / size:.1%} of text bytes{in_tokens})"

    lines = []
    if removed:
        total = sum(sum(r.values()) for r in removed.values())
        total_bytes = sum(stats.get(f"curation.bytes.{name}", 0) for name in removed)
        lines.append(f"  filtered        {total} removed{share(total, total_bytes, removed)} (listed in "
                     "curation/filtered-*.parquet)")
        for name, rules in removed.items():
            detail = ", ".join(f"{rule} {n}" for rule, n in sorted(rules.items(), key=lambda kv: -kv[1]))
            n = sum(rules.values())
            lines.append(f"    {n:>5}  {name}: {detail}{share(n, stats.get(f'curation.bytes.{name}', 0), (name,))}")
    if stats.get("curation.dedup-paragraphs.paragraphs"):  # before the filters: not in their shares
        emptied = stats.get("curation.dedup-paragraphs.emptied", 0)
        lines.append(f"  paragraphs      {stats['curation.dedup-paragraphs.paragraphs']} repeated paragraphs removed"
                     + (f", {emptied} documents left empty and removed" if emptied else "")
                     + " (--dedup-paragraphs; listed in curation/filtered-*.parquet)")
    emails, ips = stats.get("curation.pii.email", 0), stats.get("curation.pii.ip", 0)
    if emails or ips:
        lines.append(f"  pii             {emails} email addresses and {ips} IP addresses masked")
    return lines
