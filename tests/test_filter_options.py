"""Filter options: `none` turns every limit of every filter off (one spelling, None), old spellings of
off still read, every value is range-checked (a NaN threshold would compare false: the rule silently
off), and every filter is a declared `Filter`."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from click.testing import CliRunner

from curation_docs import CASES, GOOD
from shardkit.cli import main
from shardkit.errors import ConfigError
from shardkit.stages.filters import FILTERS, Curation, make_filter, parse_options
from shardkit.stages.filters.base import Filter

DOCS = [GOOD, "", "x", "lorem ipsum {", "#" * 50, "\n\n".join(["the same line."] * 20),
        *(case[1] for cases in CASES.values() for case in cases)]
# fasttext scores with a model the test trains (tests/test_fasttext.py runs these checks on it)
RULES = sorted(name for name in FILTERS if name != "fasttext")
OPTIONS = [(name, f.name) for name in RULES for f in dataclasses.fields(FILTERS[name])]


def _run_over_docs(f) -> None:
    for doc in DOCS:
        scores = f.score(doc)
        kept, rule = f.keep(scores)
        if f.decides:
            assert f.check(doc) == (kept, rule)
        assert isinstance(f.edit(doc), str)


@pytest.mark.parametrize("name,option", OPTIONS, ids=[f"{n}.{o}" for n, o in OPTIONS])
def test_none_turns_each_option_off_and_the_filter_runs(name, option):
    opts = parse_options([f"{name}.{option}=none"])[name]
    value = opts[option]
    assert value is None or value is False or value == ()
    _run_over_docs(make_filter(name, opts))


@pytest.mark.parametrize("name", RULES)
def test_every_option_of_a_filter_none_at_once(name):
    f = make_filter(name, parse_options([f"{name}.{x.name}=none" for x in dataclasses.fields(FILTERS[name])])[name])
    _run_over_docs(f)
    if f.decides and name not in ("fineweb", "lang"):  # their "empty" and "unscored" rules have no option
        assert all(f.check(doc) == (True, None) for doc in DOCS if doc.strip()), "a rule is still on"


def test_the_four_options_that_raised_typeerror_read_none_through_the_cli_path():
    cur = Curation.from_options("c4,fineweb", ["c4.max_word_length=none", "c4.min_words_per_line=none",
                                               "c4.min_num_sentences=none", "fineweb.short_line_length=none"])
    c4, fineweb = cur.steps
    assert (c4.max_word_length, c4.min_words_per_line, c4.min_num_sentences, fineweb.short_line_length) == (None,) * 4
    for doc in DOCS:
        cur.apply(doc, {})
        cur.annotate(doc)


def test_old_spellings_of_off_read_as_none():
    assert make_filter("c4", {"min_num_sentences": -1, "max_word_length": -1}).min_num_sentences is None
    assert make_filter("gopher-quality", {"max_doc_words": 0}).max_doc_words is None
    assert make_filter("lang", {"max_chars": 0}).max_chars is None
    assert make_filter("gopher-repetition", {"dup_line_frac": 0}).dup_line_frac is None


@pytest.mark.parametrize("item,why", [
    ("fineweb.line_punct_thr=nan", "a finite number"),
    ("fineweb.line_punct_thr=2", "a fraction in [0, 1]"),
    ("gopher-repetition.dup_line_frac=-0.5", "a fraction in [0, 1]"),
    ("c4.min_num_sentences=-3", "a count >= 0"),
    ("gopher-quality.max_doc_words=-2", "a count >= 0"),
    ("gopher-quality.min_avg_word_length=inf", "a finite number"),
    ("fineweb.new_line_ratio=-inf", "a finite number"),
    ("gopher-repetition.top_n_grams=2:1.5", "pairs N:FRACTION"),
    ("gopher-repetition.dup_n_grams=0:0.1", "pairs N:FRACTION"),
    ("text-length.min_chars=-1", "a count >= 0"),
    ("lang.threshold=nan", "a finite number"),
])
def test_each_value_out_of_range_is_refused(item, why):
    with pytest.raises(ConfigError, match="none turns a limit off") as e:
        parse_options([item])
    assert f"{item} (expected {why}" in str(e.value)


def test_out_of_range_from_python_is_refused_too():
    with pytest.raises(ConfigError, match=r"fineweb.line_punct_thr=nan \(expected a finite number\)"):
        make_filter("fineweb", {"line_punct_thr": math.nan})


def test_every_violation_named_in_one_line_exit_2(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text(GOOD)
    bad = ["fineweb.line_punct_thr=nan", "fineweb.short_line_thr=2", "gopher-repetition.dup_line_frac=-0.5",
           "c4.min_num_sentences=-3", "gopher-quality.min_doc_words=many"]
    args = ["build", str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "0", "--no-progress",
            "--filter", "fineweb,gopher-repetition,c4,gopher-quality"]
    result = CliRunner().invoke(main, args + [x for item in bad for x in ("--filter-option", item)])
    assert result.exit_code == 2, result.output
    err = result.stderr
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert all(item in err for item in bad), err


@pytest.mark.parametrize("name", RULES)
def test_every_filter_is_a_declared_filter(name):
    f = make_filter(name, {"languages": ("en",)} if name == "lang" else None)
    assert isinstance(f, Filter)
    assert f.verdict is None or f.columns[f.verdict] is not None
    assert f.decides is (name != "pii")


def test_a_text_over_the_bound_is_removed_as_too_large_and_never_filtered(tmp_path, monkeypatch):
    """`--filter-max-bytes`: a larger text is counted and listed as too-large, and no filter sees it
    (each holds a few copies of a text); the others are filtered as before."""
    import pyarrow.parquet as pq

    from shardkit.stages.filters.gopher import GopherQuality

    src = tmp_path / "src"
    src.mkdir()
    (src / "big.txt").write_text(GOOD * 40)  # ~40 KB of good text: kept without the bound
    (src / "small.txt").write_text(GOOD)
    seen = []
    real = GopherQuality.check
    monkeypatch.setattr(GopherQuality, "check", lambda self, text: seen.append(len(text)) or real(self, text))
    args = ["build", str(src), str(tmp_path / "out"), "--workers", "0", "--no-progress", "--filter", "gopher-quality",
            "--filter-max-bytes", "20KB"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "too-large: max_bytes 1" in result.output
    assert seen == [len(GOOD)]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["samples"] == 1 and manifest["build"]["config"]["filter_max_bytes"] == 20_000
    counts = manifest["build"]["curation"]["counts"]
    assert counts["curation.too-large.max_bytes"] == 1 and counts["curation.bytes.too-large"] == len(GOOD * 40)
    [row] = pq.read_table(sorted((tmp_path / "out" / "curation").glob("filtered-*.parquet"))).to_pylist()
    assert row["key"] == "big" and (row["filter"], row["rule"]) == ("too-large", "max_bytes")
    result = CliRunner().invoke(main, args[:-2] + ["--filter-max-bytes", "none", "--allow-empty"])
    assert result.exit_code == 0 and "too-large" not in result.output  # none: no bound
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["build"]["config"]["filter_max_bytes"] is None


def test_the_default_bound_leaves_the_recorded_config_as_it_was():
    from shardkit.config import BuildConfig

    cfg = BuildConfig("src", "out")
    assert cfg.filter_max_bytes == 10_000_000 and "filter_max_bytes" not in cfg.recorded()
    assert BuildConfig("src", "out", filter_max_bytes=None).recorded()["filter_max_bytes"] is None


def test_annotating_leaves_a_text_over_the_bound_unscored():
    from shardkit.stages.attributes import score_texts

    scorers = [make_filter("gopher-quality"), make_filter("text-length")]
    scores = score_texts([GOOD, GOOD * 40, None], scorers, max_bytes=20_000)
    assert scores.columns["text_chars"].to_pylist() == [len(GOOD.strip()), None, None]
    assert scores.failed == {"gopher-quality": 1, "text-length": 1} and scores.keep.tolist() == [True] * 3
