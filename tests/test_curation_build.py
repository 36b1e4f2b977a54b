"""Curation in the build: filters, language, PII and exact duplicates, the same bytes at 0 and 2
workers, reruns that write nothing, and exact-dedup survivors whatever the workers or file order."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from conftest import tree_bytes
from curation_docs import CASES, FRENCH, GERMAN, GOOD, SENTENCES
from shardkit.cli import main
from shardkit.config import BuildConfig
from shardkit.errors import ConfigError
from shardkit.jobs.build import build

FILTERS = "gopher-quality,gopher-repetition,c4,fineweb"


def _corpus(folder, order=None) -> dict[str, str]:
    """Two .jsonl files of good documents, documents made to trip a rule, exact duplicates (equal
    after case and punctuation are folded), German and French texts, one without letters, and PII.
    Returns {expected key: what happens to it}."""
    os.makedirs(folder, exist_ok=True)
    good = [" ".join(SENTENCES[i:]) + "\n" + "\n".join(SENTENCES[:i]) for i in range(10)]
    bad = list(dict.fromkeys(doc for name in ("gopher-quality", "c4", "fineweb")
                             for rule, doc, on, _ in CASES[name] if not on and doc.strip()))
    files = {
        "a.jsonl": good[:5] + bad[:6] + [GERMAN, "1234 5678 9012 ---", good[0].upper().replace(".", "!")],
        "b.jsonl": good[5:] + bad[6:] + [FRENCH, good[1], GOOD + "\nMail ann@mail.com or 8.8.8.8 today."],
    }
    for name in order or sorted(files):  # the files are written (and so listed) in the order given
        with open(os.path.join(folder, name), "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in files[name])
    return files


def _exact_groups(files: dict) -> list[list[str]]:
    """Keys (in key order) of each group of texts equal once normalised, groups of two or more."""
    from shardkit.duplicates.text import tokens

    groups: dict = {}
    for name in sorted(files):
        for i, text in enumerate(files[name], 1):
            groups.setdefault(tuple(tokens(text)[0]), []).append(f"{name[:-6]}/{i:06d}")
    return [keys for keys in groups.values() if len(keys) > 1]


def _build(src, out, **kw):
    opts = dict(filter=FILTERS, lang="en,de", mask_pii=True, dedup_exact=True, progress=False,
                max_samples_per_shard=4, format="both")
    opts.update(kw)
    return build(BuildConfig(str(src), str(out), **opts))


def _filtered(out) -> list[dict]:
    files = sorted((out / "curation").glob("filtered-*.parquet"))
    return pq.read_table(files).sort_by("key").to_pylist() if files else []


def rule_counts(stats: dict) -> dict:
    """The rejections by filter and rule (curation.<filter>.<rule>), without PII counts and volumes."""
    return {k: v for k, v in stats.items() if k.startswith("curation.") and k.split(".")[1] not in ("pii", "input", "bytes", "tokens")}


def _removed_texts(files: dict, removed) -> list[dict]:
    """The texts (as written) of the removed samples, from _corpus's {file name: texts}."""
    return [{"txt": files[r["source"]][r["source_row"] - 1]} for r in removed]


def test_filters_lang_pii_and_exact_dups_same_bytes_at_0_and_2_workers(tmp_path):
    files = _corpus(tmp_path / "src")
    a = _build(tmp_path / "src", tmp_path / "a", workers=0)
    b = _build(tmp_path / "src", tmp_path / "b", workers=2)
    # dedup/*/summary.json records how the run was executed (seconds, workers): the rest must match
    skip = (".shardkit", "dedup")
    assert tree_bytes(tmp_path / "a", skip=skip) == tree_bytes(tmp_path / "b", skip=skip)
    clusters = "dedup/exact/clusters.parquet"
    assert (tmp_path / "a" / clusters).read_bytes() == (tmp_path / "b" / clusters).read_bytes()
    removed = _filtered(tmp_path / "a")
    rules = {(r["filter"], r["rule"]) for r in removed}
    assert ("lang", "other_language") in rules and ("lang", "unscored") in rules  # French; no letters
    assert {"gopher-quality", "c4", "fineweb"} <= {f for f, _ in rules}
    assert all(r["source"] in ("a.jsonl", "b.jsonl") and r["source_row"] >= 1 for r in removed)
    counted = rule_counts(a.stats)
    assert sum(counted.values()) == len(removed) and a.stats == b.stats
    # the volume the filters saw and removed: every document with text once, the removed ones by filter
    assert a.stats["curation.input.documents"] == a.inputs - a.exact_duplicates
    assert sum(v for k, v in a.stats.items() if k.startswith("curation.bytes.")) == sum(
        len(r["txt"].encode()) for r in _removed_texts(files, removed))
    assert a.stats["curation.lang.unscored"] == 1  # counted with its reason; the build went on
    assert a.stats["curation.pii.email"] == 1 and a.stats["curation.pii.ip"] == 1
    groups = _exact_groups(files)  # good[0] shouted, good[1] again in b.jsonl, texts equal but for punctuation
    assert a.exact_duplicates == sum(len(g) - 1 for g in groups) >= 2
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["build"]["curation"]["counts"] == dict(sorted(a.stats.items()))
    assert m["build"]["dedup_exact"]["removed"] == a.exact_duplicates
    texts = [r["txt"] for s in m["shards"] if s["format"] == "parquet"
             for r in pq.read_table(tmp_path / "a" / s["path"], columns=["txt"]).to_pylist()]
    assert any("email@example.com" in t for t in texts) and not any("ann@mail.com" in t for t in texts)
    assert a.samples + len(removed) + a.exact_duplicates == a.inputs


def test_rerun_with_nothing_changed_writes_nothing(tmp_path):
    _corpus(tmp_path / "src")
    out = tmp_path / "out"
    first = _build(tmp_path / "src", out, workers=0)
    before = tree_bytes(out)
    stamps = {p: os.stat(out / p).st_mtime_ns for p in before if p.startswith(("shards", "curation", "dedup"))}
    second = _build(tmp_path / "src", out, workers=0)
    planned = len(os.listdir(out / ".shardkit" / "done"))  # shards emptied by the filters are planned too
    assert first.reused_shards == 0 and second.reused_shards == planned > len({s.id for s in first.shards})
    assert tree_bytes(out) == before
    assert {p: os.stat(out / p).st_mtime_ns for p in stamps} == stamps  # not rewritten, not even alike
    assert second.stats == first.stats  # the summary's counts come from the markers


def test_changing_a_threshold_rebuilds_and_updates_the_list(tmp_path):
    _corpus(tmp_path / "src")
    out = tmp_path / "out"
    _build(tmp_path / "src", out, workers=0)
    short = [r["key"] for r in _filtered(out) if r["rule"] == "short_doc"]
    again = _build(tmp_path / "src", out, workers=0, filter_option=("gopher-quality.min_doc_words=none",))
    assert again.reused_shards == 0
    assert not any(r["rule"] == "short_doc" for r in _filtered(out)) and short


@pytest.mark.parametrize("workers,order", [(0, ["b.jsonl", "a.jsonl"]), (2, ["a.jsonl", "b.jsonl"])])
def test_exact_dedup_survivors_whatever_workers_and_file_order(tmp_path, workers, order):
    groups = _exact_groups(_corpus(tmp_path / "ref"))
    ref = _build(tmp_path / "ref", tmp_path / "ref_out", workers=0, filter=None, lang=None, mask_pii=False)
    _corpus(tmp_path / "src", order=order)
    got = _build(tmp_path / "src", tmp_path / "out", workers=workers, filter=None, lang=None, mask_pii=False)
    clusters = pq.read_table(tmp_path / "out" / "dedup" / "exact" / "clusters.parquet").to_pylist()
    assert {(c["key"], c["kept"]) for c in clusters} == {
        (c["key"], c["kept"]) for c in pq.read_table(tmp_path / "ref_out/dedup/exact/clusters.parquet").to_pylist()}
    assert {c["key"] for c in clusters if c["kept"]} == {g[0] for g in groups}  # the smallest key of each
    assert {c["key"] for c in clusters} == {k for g in groups for k in g}
    assert got.exact_duplicates == ref.exact_duplicates == sum(len(g) - 1 for g in groups)
    assert tree_bytes(tmp_path / "out", skip=(".shardkit", "dedup")) == tree_bytes(
        tmp_path / "ref_out", skip=(".shardkit", "dedup"))


def test_exact_dedup_runs_before_minhash(tmp_path):
    exact = sum(len(g) - 1 for g in _exact_groups(_corpus(tmp_path / "src")))
    r = _build(tmp_path / "src", tmp_path / "out", workers=0, filter=None, lang=None, mask_pii=False, dedup=True)
    near = json.loads((tmp_path / "out" / "dedup" / "summary.json").read_text())
    assert r.exact_duplicates == exact and near["inputs"] == r.inputs - exact  # MinHash never saw the exact copies


def test_cli_summary_counts_each_filter_and_rule(tmp_path):
    exact = sum(len(g) - 1 for g in _exact_groups(_corpus(tmp_path / "src")))
    res = CliRunner().invoke(main, ["build", str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "0",
                                    "--no-progress", "--filter", FILTERS, "--lang", "en,de", "--mask-pii",
                                    "--dedup-exact", "--filter-option", "c4.min_num_sentences=5"])
    assert res.exit_code == 0, res.output
    assert "filtered" in res.output and "curation/filtered-*.parquet" in res.output
    assert "gopher-quality: " in res.output and "lang: " in res.output and "short_doc" in res.output
    assert "1 email addresses and 1 IP addresses masked" in res.output
    assert f"exact dups      {exact} removed" in res.output
    bad = CliRunner().invoke(main, ["build", str(tmp_path / "src"), str(tmp_path / "o2"), "--filter", "gopher"])
    assert bad.exit_code == 1 and "choose among" in bad.output and not (tmp_path / "o2").exists()


def _doc(item: int) -> dict:
    """build_map's function: input i -> a text sample (good, or made to trip a rule)."""
    texts = [GOOD, "\n".join(SENTENCES[:3]), GERMAN, "\n".join(f"New York {w}." for w in "is big old".split())]
    return {"__key__": f"doc{item:03d}", "txt": texts[item % len(texts)] + ("" if item < 4 else f" ({item})")}


def test_build_map_runs_the_same_filters(tmp_path):
    from shardkit.jobs.map import build_map
    from shardkit.stages.filters import Curation

    cur = Curation.from_options(FILTERS, lang="en")
    a = build_map(_doc, list(range(12)), str(tmp_path / "a"), workers=0, curation=cur, inputs_per_shard=5,
                  progress=False)
    b = build_map(_doc, list(range(12)), str(tmp_path / "b"), workers=2, curation=cur, inputs_per_shard=5,
                  progress=False)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    removed = _filtered(tmp_path / "a")
    assert a.samples + len(removed) == 12 and a.samples == 3  # only the good documents
    assert {("lang", "other_language"), ("gopher-quality", "short_doc")} <= {(r["filter"], r["rule"]) for r in removed}
    assert sum(rule_counts(a.stats).values()) == len(removed) and a.stats == b.stats
    assert all(r["source"] == repr(int(r["key"][3:])) for r in removed)  # the input, as errors.jsonl names it
    again = build_map(_doc, list(range(12)), str(tmp_path / "a"), workers=0, curation=cur, inputs_per_shard=5,
                      progress=False)
    assert again.stats == a.stats and again.reused_shards == len({s.path.split(".")[0] for s in a.shards})
    plain = build_map(_doc, list(range(12)), str(tmp_path / "a"), workers=0, inputs_per_shard=5, progress=False)
    assert plain.samples == 12 and not _filtered(tmp_path / "a")  # curation off: every list goes


def test_dedup_of_a_raw_folder_runs_the_filters(tmp_path):
    files = _corpus(tmp_path / "src")
    res = CliRunner().invoke(main, ["dedup", str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "0",
                                    "--no-progress", "--filter", FILTERS, "--lang", "en,de", "--dedup-exact"])
    assert res.exit_code == 0, res.output
    ref = _build(tmp_path / "src", tmp_path / "ref", workers=0, dedup=True, mask_pii=False, format="tar")
    assert _filtered(tmp_path / "out") == _filtered(tmp_path / "ref") and len(files) == 2
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["samples"] == ref.samples and m["build"]["curation"]["counts"] == {
        k: v for k, v in ref.stats.items() if k.startswith("curation.")}
    again = CliRunner().invoke(main, ["dedup", str(tmp_path / "out"), str(tmp_path / "o2"), "--dedup-exact"])
    assert again.exit_code == 1 and "already links texts equal once normalised" in again.output


def _distinct_corpus(folder) -> None:
    """_corpus's rule-trippers, languages and PII beside 30 good documents distinct enough for MinHash
    (random sentences), one of them copied: the dedup and the filters both have work."""
    import random

    rng = random.Random(7)
    words = [("river", "valley", "school", "market", "garden", "bridge", "forest", "village", "harbour", "chapel"),
             ("quiet", "old", "green", "narrow", "busy", "distant", "bright", "famous", "simple", "northern"),
             ("leads", "belongs", "returns", "points", "turns", "opens", "moves", "listens", "speaks", "waits")]

    def sentence() -> str:
        n, a, v = (rng.choice(w) for w in words)
        return f"The {a} {n} {v} to the {rng.choice(words[1])} {rng.choice(words[0])} with {rng.randrange(99)} friends and a {n}."

    good = ["\n".join(sentence() for _ in range(9)) for _ in range(31)]
    bad = list(dict.fromkeys(doc for name in ("gopher-quality", "c4", "fineweb")
                             for rule, doc, on, _ in CASES[name] if not on and doc.strip()))
    files = {"a.jsonl": good[:15] + bad[:6] + [GERMAN, good[3]],
             "b.jsonl": good[15:30] + bad[6:] + [FRENCH, good[30] + "\nMail ann@mail.com today."]}
    os.makedirs(folder, exist_ok=True)
    for name, texts in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)


@pytest.mark.parametrize("workers", [0, 2])
def test_dedup_of_a_built_dataset_keeps_what_build_keeps_with_the_same_flags(tmp_path, workers):
    """build RAW --filter --lang --mask-pii --dedup == build RAW, then dedup DATASET --filter --lang
    --mask-pii: the same samples and texts (PII masked), the same list of what the filters removed,
    the same counts in the manifest."""
    _distinct_corpus(tmp_path / "src")
    ref = _build(tmp_path / "src", tmp_path / "ref", workers=0, dedup=True, dedup_exact=False)
    _build(tmp_path / "src", tmp_path / "plain", workers=0, filter=None, lang=None, mask_pii=False, dedup_exact=False)
    res = CliRunner().invoke(main, ["dedup", str(tmp_path / "plain"), str(tmp_path / "out"), "--workers", str(workers),
                                    "--no-progress", "--filter", FILTERS, "--lang", "en,de", "--mask-pii"])
    assert res.exit_code == 0, res.output
    texts = _texts(tmp_path / "out")
    assert texts == _texts(tmp_path / "ref") and not any("ann@mail.com" in t for t in texts.values())
    assert _filtered(tmp_path / "out") == _filtered(tmp_path / "ref") and _filtered(tmp_path / "ref")
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["samples"] == ref.samples and m["build"]["curation"]["counts"] == {
        k: v for k, v in ref.stats.items() if k.startswith("curation.")}
    assert "gopher-quality:" in res.output and "1 email addresses" in res.output and len(texts) > 20
    tars = sorted(s["path"] for s in m["shards"] if s["format"] == "tar")
    assert tars and all((tmp_path / "out" / p).is_file() for p in tars)


def test_dedup_config_curation_and_the_older_side_dict_agree(tmp_path):
    from shardkit.config import DedupConfig
    from shardkit.jobs.dedup import dedup

    _distinct_corpus(tmp_path / "src")
    _build(tmp_path / "src", tmp_path / "plain", workers=0, filter=None, lang=None, mask_pii=False, dedup_exact=False)
    flags = {"filter": "c4,fineweb", "lang": "en"}
    a = dedup(DedupConfig(str(tmp_path / "plain"), str(tmp_path / "a"), workers=0, progress=False, curation=flags))
    b = dedup(DedupConfig(str(tmp_path / "plain"), str(tmp_path / "b"), workers=0, progress=False), flags)
    assert a.summary["curation"] == b.summary["curation"] and a.summary["curation"]
    assert _texts(tmp_path / "a") == _texts(tmp_path / "b")
    with pytest.raises(ConfigError, match="curation fields"):
        DedupConfig("x", "y", curation={"filters": "c4"})


def _boilerplate(folder, order=("a.jsonl", "b.jsonl")) -> None:
    footer = "Copyright 2024 Example Corp. All rights reserved."
    files = {"a.jsonl": [f"{SENTENCES[i]}\n{footer}\n{SENTENCES[i + 1]}" for i in range(0, 8, 2)],
             "b.jsonl": [f"{footer}\n\nThe second file's document {i} tells its own story." for i in range(4)]
             + [f"{footer}\n{SENTENCES[0]}"]}
    os.makedirs(folder, exist_ok=True)
    for name in order:
        with open(os.path.join(folder, name), "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in files[name])


def _texts(out) -> dict[str, str]:
    m = json.loads((out / "manifest.json").read_text())
    rows = [r for s in m["shards"] if s["format"] == "parquet"
            for r in pq.read_table(out / s["path"], columns=["__key__", "txt"]).to_pylist()]
    return {r["__key__"]: r["txt"] for r in rows}


@pytest.mark.parametrize("workers,order,partition", [(0, ("a.jsonl", "b.jsonl"), 5000),
                                                     (2, ("b.jsonl", "a.jsonl"), 3)])
def test_dedup_paragraphs_keeps_the_first_copy_whatever_workers_order_and_partitions(
        tmp_path, monkeypatch, workers, order, partition):
    from shardkit.config import DedupConfig

    monkeypatch.setattr(DedupConfig, "partition_size", partition)
    _boilerplate(tmp_path / "src", order)
    r = _build(tmp_path / "src", tmp_path / "out", workers=workers, filter=None, lang=None, mask_pii=False,
               dedup_exact=False, dedup_paragraphs=True)
    texts = _texts(tmp_path / "out")
    footer = "Copyright 2024 Example Corp. All rights reserved."
    assert [k for k, t in sorted(texts.items()) if footer in t] == ["a/000001"]  # the first copy in key order
    assert texts["a/000002"] == f"{SENTENCES[2]}\n{SENTENCES[3]}"
    assert texts["b/000001"] == "\nThe second file's document 0 tells its own story."  # blank lines stay
    assert "b/000005" not in texts  # its one paragraph left was SENTENCES[0], a copy of a/000001's
    assert _filtered(tmp_path / "out") == [{"key": "b/000005", "source": "b.jsonl", "source_row": 5,
                                            "filter": "dedup-paragraphs", "rule": "emptied"}]
    assert r.stats["curation.dedup-paragraphs.paragraphs"] == 9 and r.stats["curation.dedup-paragraphs.emptied"] == 1


def test_a_build_the_filters_empty_says_so(tmp_path):
    from shardkit.errors import EmptyInput

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text("".join(json.dumps({"text": f"{i} 5678 ---"}) + "\n" for i in range(5)))
    with pytest.raises(EmptyInput, match=r"0 inputs rejected .*; 5 removed by the curation filters .*--filter-option"):
        _build(tmp_path / "src", tmp_path / "out", workers=0)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_where_on_a_token_dataset_is_refused_with_the_reason(tmp_path):
    from shardkit.reader.dataset import StreamingDataset

    _distinct_corpus(tmp_path / "src")
    _build(tmp_path / "src", tmp_path / "tok", workers=0, tokenizer="bpe:300", seq_len=16, format="parquet",
           dedup_exact=False, mask_pii=False)
    with pytest.raises(ConfigError, match="holds token rows, which have no attributes: a packed row mixes"):
        StreamingDataset(str(tmp_path / "tok"), where="fasttext_score > 0.5")


def test_the_tokenizer_trains_on_the_curated_text(tmp_path):
    _distinct_corpus(tmp_path / "src")
    with open(tmp_path / "src" / "c.jsonl", "w") as f:  # what gopher-repetition removes: one word, 300 times
        f.write(json.dumps({"text": " ".join(["qzxvokjuw"] * 300)}) + "\n")

    def vocab(name, **kw) -> set:
        r = _build(tmp_path / "src", tmp_path / name, workers=0, tokenizer="bpe:400", format="parquet", lang=None,
                   dedup_exact=False, **kw)
        tok = json.loads((tmp_path / name / "tokenizer.json").read_text())
        return r, {t for t in tok["model"]["vocab"] if "qzx" in t or "vok" in t}

    _, plain = vocab("plain", filter=None)
    r, curated = vocab("curated", filter="gopher-repetition")
    assert plain and not curated and rule_counts(r.stats)


@pytest.mark.parametrize("seq_len", [None, 16])
def test_savings_in_tokens_add_up(tmp_path, seq_len):
    from tokenizers import Tokenizer

    _distinct_corpus(tmp_path / "src")
    res = CliRunner().invoke(main, ["build", str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "0",
                                    "--no-progress", "--filter", FILTERS, "--lang", "en,de", "--mask-pii",
                                    "--tokenizer", "bpe:300", "--format", "parquet",
                                    *(["--seq-len", str(seq_len)] if seq_len else [])])
    assert res.exit_code == 0, res.output
    counts = json.loads((tmp_path / "out" / "manifest.json").read_text())["build"]["curation"]["counts"]
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    texts = {f"{name[:-6]}/{i:06d}": json.loads(line)["text"] for name in ("a.jsonl", "b.jsonl")
             for i, line in enumerate(open(tmp_path / "src" / name), 1)}
    n = {k: len(tok.encode(t, add_special_tokens=False).ids) for k, t in texts.items()}
    removed = {}
    for r in _filtered(tmp_path / "out"):
        removed[r["filter"]] = removed.get(r["filter"], 0) + n[r["key"]]
    kept = sum(n[k] for k in texts if k not in {r["key"] for r in _filtered(tmp_path / "out")})
    assert counts["curation.input.tokens"] == sum(n.values()) == kept + sum(removed.values())
    assert {k.split(".", 2)[2]: v for k, v in counts.items() if k.startswith("curation.tokens.")} == removed
    assert len(removed) >= 3 and f"{sum(removed.values()) / sum(n.values()):.1%} of tokens" in res.output
