"""Curation filters: each rule on a document made to trip it, the registry interface, options,
the word splitting they count with, language ID and PII masking."""

from __future__ import annotations

import pyarrow as pa
import pytest

from curation_docs import CASES, FRENCH, GERMAN, GOOD
from shardkit.errors import ConfigError
from shardkit.stages.filters import FILTERS, Curation, curate, make_filter, parse_options
from shardkit.stages.filters.words import sentences, words
from shardkit.sample import Sample

RULE_CASES = [(name, *case) for name, cases in CASES.items() for case in cases]


@pytest.mark.parametrize("name,rule,doc,on,off", RULE_CASES, ids=[f"{c[0]}:{c[1]}" for c in RULE_CASES])
def test_each_rule_reports_itself_and_only_it(name, rule, doc, on, off):
    f = make_filter(name, on)
    assert f.check(doc) == (False, rule)
    assert f.keep(f.score(doc)) == (False, rule)  # the verdict from the stored signals alone
    if off is not None:  # with that rule's threshold off, nothing else in the filter rejects it
        assert make_filter(name, {**on, **off}).check(doc) == (True, None)


@pytest.mark.parametrize("name", ["gopher-quality", "gopher-repetition", "c4", "fineweb"])
def test_a_good_document_passes(name):
    f = make_filter(name)
    assert f.check(GOOD) == (True, None) == f.keep(f.score(GOOD))


@pytest.mark.parametrize("name", sorted(set(FILTERS) - {"fasttext"}))  # fasttext needs a model: test_fasttext.py
def test_interface_columns_match_scores(name):
    f = make_filter(name, {"languages": ("en",)} if name == "lang" else None)
    scores = f.score(GOOD)
    assert f.name == name
    assert all(isinstance(t, pa.DataType) for t in f.columns.values())
    assert set(scores) <= set(f.columns)
    verdict = name.replace("-", "_")
    if name not in ("lang", "pii"):
        assert set(f.columns) - set(scores) == {verdict} and f.columns[verdict] == pa.bool_()
    assert f.score(GOOD) == scores  # pure: the same text scores the same
    pa.table({k: pa.array([v], f.columns[k]) for k, v in scores.items()})  # each value fits its column


def test_options_parse_and_bad_ones_say_what_to_fix():
    opts = parse_options(["gopher-quality.min_doc_words=30", "gopher-quality.max_doc_words=none",
                          "c4.filter_policy=false", "gopher-repetition.top_n_grams=2:0.3",
                          "gopher-quality.stop_words=the,and"])
    assert opts["gopher-quality"] == {"min_doc_words": 30, "max_doc_words": None, "stop_words": ("the", "and")}
    assert make_filter("gopher-repetition", opts["gopher-repetition"]).top_n_grams == ((2, 0.3),)
    assert make_filter("c4", opts["c4"]).filter_policy is False
    with pytest.raises(ConfigError, match="no option 'min_words'.*min_doc_words"):
        parse_options(["gopher-quality.min_words=3"])
    with pytest.raises(ConfigError, match="no filter 'gopher'"):
        parse_options(["gopher.min_doc_words=3"])
    with pytest.raises(ConfigError, match="FILTER.OPTION=VALUE"):
        parse_options(["min_doc_words=3"])
    with pytest.raises(ConfigError, match="expected a value like 50"):
        parse_options(["gopher-quality.min_doc_words=many"])
    with pytest.raises(ConfigError, match="choose among"):
        Curation.from_options("gopher-quality,bogus")
    with pytest.raises(ConfigError, match="not run: add it to --filter"):
        Curation.from_options("c4", ["fineweb.short_line_thr=0.5"])


def test_curation_order_and_record():
    cur = Curation.from_options("c4,gopher-quality", (), lang="en", mask_pii=True)
    assert [f.name for f in cur.steps] == ["lang", "c4", "gopher-quality", "pii"]
    assert cur.record()["gopher-quality"]["min_doc_words"] == 50  # defaults are part of what a build records


def test_c4_keeps_only_the_lines_it_keeps_and_the_next_filter_sees_them():
    c4 = make_filter("c4")
    doc = GOOD + "\nEnable JavaScript to see this page.\nno punctuation here\nShort."
    assert c4.edit(doc) == GOOD
    stats: dict = {}
    text, rejected = Curation.from_options("c4,fineweb").apply(doc, stats)
    assert rejected is None and text == GOOD and stats == {}


def test_pii_masks_emails_and_public_ips_restarting_per_document():
    pii = make_filter("pii")
    doc = "Write to ann@mail.com, bob@corp.io or eve@x.org from 8.8.8.8; the router is 192.168.1.1."
    assert pii.score(doc) == {"pii_email": 3, "pii_ip": 1}
    masked = pii.edit(doc)
    assert masked == ("Write to email@example.com, firstname.lastname@example.org or email@example.com from "
                      "22.214.171.124; the router is 192.168.1.1.")
    assert pii.edit(doc) == masked  # no state carried from the document before
    stats: dict = {}
    Curation.from_options(None, mask_pii=True).apply(doc, stats)
    assert stats == {"curation.pii.email": 3, "curation.pii.ip": 1}


def test_language_id_keeps_the_asked_languages_and_counts_what_it_cannot_score():
    f = make_filter("lang", {"languages": "en,de", "threshold": 0.65})
    assert f.check(GERMAN) == (True, None) and f.score(GERMAN)["lang"] == "de"
    assert f.check(GOOD) == (True, None)
    assert f.check(FRENCH) == (False, "other_language")
    assert f.score("1234 5678 ---") == {"lang": "und", "lang_score": 0.0}
    assert f.check("1234 5678 ---") == (False, "unscored")
    assert make_filter("lang", {"threshold": 0.9999999}).check(FRENCH[:20]) == (False, "low_score")
    with pytest.raises(ConfigError, match="not a language the model knows"):
        make_filter("lang", {"languages": "xx"})
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        make_filter("lang", {"threshold": 1.5})


def test_curate_stage_counts_lists_and_passes_samples_without_text():
    samples = [Sample("a", {"txt": GOOD}, {"source_path": "d.jsonl", "source_row": 1}),
               Sample("b", {"txt": "\n".join(GOOD.splitlines()[:2])}, {"source_path": "d.jsonl", "source_row": 2}),
               Sample("c", {"jpg": b"\xff"}, {})]
    stats, dropped = {}, []
    kept = list(curate(samples, curation=Curation.from_options("gopher-quality"), stats=stats, dropped=dropped))
    assert [s.key for s in kept] == ["a", "c"]
    assert dropped == [("b", "d.jsonl", 2, "gopher-quality", "short_doc")]
    short = len("\n".join(GOOD.splitlines()[:2]).encode())
    assert stats == {"curation.gopher-quality.short_doc": 1, "curation.input.documents": 2,
                     "curation.input.bytes": len(GOOD.encode()) + short, "curation.bytes.gopher-quality": short}


def test_the_summary_gives_each_filters_share_of_the_documents_and_bytes_it_saw():
    from shardkit.cli.curation import curation_lines

    stats = {"curation.input.documents": 200, "curation.input.bytes": 10_000, "curation.c4.javascript": 30,
             "curation.c4.policy": 10, "curation.bytes.c4": 2_500, "curation.lang.other_language": 10,
             "curation.bytes.lang": 500, "curation.pii.email": 2}
    lines = curation_lines(stats)
    assert lines[0] == "  filtered        50 removed (25.0% of documents, 30.0% of text bytes) (listed in curation/filtered-*.parquet)"
    assert lines[1] == "       40  c4: javascript 30, policy 10 (20.0% of documents, 25.0% of text bytes)"
    assert lines[2] == "       10  lang: other_language 10 (5.0% of documents, 5.0% of text bytes)"
    assert lines[3] == "  pii             2 email addresses and 0 IP addresses masked"
    # counts recorded before the volumes were (a dataset built earlier): no share, the same lines otherwise
    assert curation_lines({"curation.c4.policy": 3})[1] == "        3  c4: policy 3"
    # --dedup-paragraphs runs before the filters, on paragraphs: its own line, outside their shares
    paragraphs = curation_lines({**stats, "curation.dedup-paragraphs.paragraphs": 9, "curation.dedup-paragraphs.emptied": 1})
    assert paragraphs[:3] == lines[:3] and paragraphs[3] == ("  paragraphs      9 repeated paragraphs removed, 1 documents "
                                                             "left empty and removed (--dedup-paragraphs; listed in "
                                                             "curation/filtered-*.parquet)")


@pytest.mark.parametrize("text,expected", [
    ("Don't stop, it's fine.", ["Do", "n't", "stop", ",", "it", "'s", "fine", "."]),
    ("See e.g. the U.K. and Mr. Smith's well-known site https://example.com/a-b.", [
        "See", "e.g.", "the", "U.K.", "and", "Mr.", "Smith", "'s", "well", "-", "known", "site",
        "https://example.com/a-b", "."]),
    ('He said "hello"... (really) :) 10km $5 end.', [
        "He", "said", '"', "hello", '"', "...", "(", "really", ")", ":)", "10", "km", "$", "5", "end", "."]),
    ("def f(): return {x}", ["def", "f", "(", "):", "return", "{", "x", "}"]),
    ("gonna dont 5pm and/or", ["gon", "na", "do", "nt", "5", "pm", "and/or"]),
])
def test_words_follow_spacys_english_rules(text, expected):
    assert words(text) == expected


def test_sentence_count_follows_the_sentencizer():
    assert sentences("One. Two! Three? See e.g. this one.") == 4
    assert sentences("See e.g. this one.") == 1
    assert sentences("No end mark") == 1
    assert sentences("Ends here...") == 1
    assert sentences("") == 0


def test_annotate_gives_every_column_and_the_same_verdicts_as_check():
    cur = Curation.from_options("gopher-quality,gopher-repetition,c4,fineweb", lang="en", mask_pii=True)
    for _, rule, doc, on, _ in RULE_CASES:
        if on:
            continue
        _, row = cur.annotate(doc)
        assert set(row) == set(cur.columns)
        _, rejected = cur.apply(doc, {})
        first_false = next((f.name for f in cur.steps if f.name not in ("lang", "pii")
                            and row[f.name.replace("-", "_")] is False), None)
        if rejected is not None and rejected[0] != "lang":
            assert first_false == rejected[0]


def test_a_text_the_model_fails_on_is_unscored_not_a_crash(monkeypatch):
    from shardkit.stages.filters import lang as lang_mod

    class Broken:
        nb_classes = lang_mod.identifier().nb_classes

        def classify(self, text):
            raise ValueError("bad input")

    monkeypatch.setitem(lang_mod._MODEL, "model", Broken())
    f = make_filter("lang", {"languages": "en"})
    assert f.score(GOOD) == {"lang": "und", "lang_score": 0.0} and f.check(GOOD) == (False, "unscored")


def test_a_huge_chunk_is_split_in_linear_time():
    # 200,000 characters without a space: the URL expression alone would take hours on it
    assert len(words("ab:c" * 50_000)) > 1
