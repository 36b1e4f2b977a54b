"""`shardkit annotate` and `build --annotate`: attribute tables beside the shards (never rewriting them),
reruns that score only what changed, the lock, the manifest last, stored selections, verify."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest
from click.testing import CliRunner
from test_attributes import write_corpus
from test_remote import served  # noqa: F401  (fixture)

from shardkit.cli import main
from shardkit.cli.annotate import annotate_summary
from shardkit.config import AnnotateConfig, BuildConfig
from shardkit.contract import key_hash
from shardkit.errors import ConfigError, FolderLocked, ManifestError, ShardError
from shardkit.jobs.annotate import annotate
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest
from shardkit.reader import selection
from shardkit.reader.partition import locate
from shardkit.reader.dataset import StreamingDataset
from shardkit.stages import filters
from shardkit.stages.filters import TextLength


def make(tmp_path, name="out", raw="raw", **options) -> str:
    out = tmp_path / name
    build(BuildConfig(str(tmp_path / raw), str(out), max_samples_per_shard=37, workers=0, progress=False, **options))
    return str(out)


def files(root, folder) -> dict:
    """{name: (bytes, mtime_ns)} of the files in ROOT/folder."""
    path = os.path.join(root, folder)
    return {n: (open(os.path.join(path, n), "rb").read(), os.stat(os.path.join(path, n)).st_mtime_ns)
            for n in sorted(os.listdir(path))}


def run(out, scorers="text-length", **options):
    return annotate(AnnotateConfig(out, scorers=scorers, workers=options.pop("workers", 0), progress=False, **options))


@pytest.fixture
def corpus(tmp_path):
    texts = write_corpus(tmp_path / "raw", 300)
    return tmp_path, texts


def test_annotate_adds_columns_without_rewriting_shards(corpus):
    tmp, texts = corpus
    out = make(tmp, format="both")
    shards = files(out, "shards")
    result = run(out)
    assert files(out, "shards") == shards and result.written == result.shards == len(load_manifest(out).shards_of())
    kept = sorted(k for k, t in texts.items() if TextLength().keep({"text_chars": len(t.strip())})[0])
    assert [s["__key__"] for s in StreamingDataset(out, where="text_length", shuffle=False)] == kept
    # The same tables, byte for byte, as `build --annotate` writes in its shard steps.
    built = make(tmp, "built", filter="text-length", annotate=True, format="both")
    assert files(out, "attributes").keys() == files(built, "attributes").keys()
    assert all(a[0] == b[0] for a, b in zip(files(out, "attributes").values(), files(built, "attributes").values()))


def test_rerun_scores_only_new_and_changed_shards_and_writes_nothing_when_nothing_changed(corpus):
    tmp, _ = corpus
    out = make(tmp)
    run(out)
    manifest = (os.stat(f"{out}/manifest.json").st_mtime_ns, open(f"{out}/manifest.json").read())
    tables = files(out, "attributes")
    again = run(out)
    assert again.written == 0 and not again.manifest_written
    assert files(out, "attributes") == tables
    assert (os.stat(f"{out}/manifest.json").st_mtime_ns, open(f"{out}/manifest.json").read()) == manifest
    before = {(s.id, s.sha256) for s in load_manifest(out).shards_of()}
    write_corpus(tmp / "raw" / "more", 60, seed=1)  # new shards, and the last old one fills up
    make(tmp)
    changed = [s for s in load_manifest(out).shards_of() if (s.id, s.sha256) not in before]
    assert 2 <= len(changed) < len(before)
    assert run(out).written == len(changed)
    assert len(StreamingDataset(out, where="not text_length")) + len(StreamingDataset(out, where="text_length")) == 360


@dataclass(frozen=True)
class Words:
    """A second scorer, registered as a real one would be."""

    name = "words"

    @property
    def columns(self):
        import pyarrow as pa

        return {"words": pa.int32()}

    def score(self, text):
        return {"words": len(text.split())}

    def keep(self, scores):
        return True, None


def test_a_second_scorer_keeps_the_first_ones_columns_and_the_bytes_of_one_run(corpus, monkeypatch):
    tmp, texts = corpus
    monkeypatch.setitem(filters.FILTERS, "words", Words)
    one, two = make(tmp, "one"), make(tmp, "two")
    run(one)

    def refuse(self, text):
        raise AssertionError("text-length scored again")

    with monkeypatch.context() as m:
        m.setattr(TextLength, "score", refuse)
        assert run(one, "words").written == len(load_manifest(one).shards_of())  # text-length's columns copied
    run(two, "text-length,words")
    assert files(one, "attributes").keys() == files(two, "attributes").keys()
    assert [v[0] for v in files(one, "attributes").values()] == [v[0] for v in files(two, "attributes").values()]
    assert list(load_manifest(one).extra["attributes"]["columns"]) == ["text_chars", "text_length", "words"]
    ds = StreamingDataset(one, where="words >= 10 and text_length", shuffle=False)
    assert [s["__key__"] for s in ds] == sorted(k for k, t in texts.items()
                                                if len(t.split()) >= 10 and len(t.strip()) >= 100)


def test_annotate_runs_on_dask_with_the_same_bytes(corpus):
    tmp, _ = corpus
    here, there = make(tmp, "here"), make(tmp, "there")
    run(here, workers=0)
    run(there, workers=2)
    assert [v[0] for v in files(here, "attributes").values()] == [v[0] for v in files(there, "attributes").values()]
    assert open(f"{here}/manifest.attributes.parquet", "rb").read() == \
        open(f"{there}/manifest.attributes.parquet", "rb").read()


HOLD = """
import sys
from shardkit.store.locks import folder_lock
with folder_lock(sys.argv[1], "test holder"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_annotate_takes_the_lock(corpus):
    tmp, _ = corpus
    out = make(tmp)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, out], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(FolderLocked, match="being written by `test holder`"):
            run(out)
    finally:
        holder.communicate("")
    assert "attributes" not in load_manifest(out).extra


def test_a_failed_run_leaves_the_manifest_and_its_rerun_reuses_what_was_written(corpus):
    tmp, _ = corpus
    out = make(tmp)
    manifest = open(f"{out}/manifest.json").read()
    shards = load_manifest(out).shards_of()
    victim = os.path.join(out, shards[3].path)
    saved = open(victim, "rb").read()
    os.remove(victim)
    with pytest.raises(ShardError, match="is missing"):
        run(out)
    assert open(f"{out}/manifest.json").read() == manifest  # the manifest is written last
    assert len(os.listdir(f"{out}/attributes")) == 3  # the tables done before the failure
    open(victim, "wb").write(saved)
    assert run(out).written == len(shards) - 3


def test_stored_selections_plan_without_reading_attribute_tables(corpus, monkeypatch):
    tmp, _ = corpus
    out = make(tmp)
    result = run(out, select=("text_length and  text_chars < 250",))
    assert result.selections == {"text_length and text_chars < 250": len(StreamingDataset(
        out, where="text_chars < 250 and text_length"))}
    reads = []
    real = selection.read_columns
    monkeypatch.setattr(selection, "read_columns", lambda root, info, *a, **k: reads.append(info.id) or
                        real(root, info, *a, **k))
    ds = StreamingDataset(out, where="text_length and text_chars<250")  # written otherwise: the same selection
    assert reads == []
    for rank in range(2):  # a rank reads the attribute tables of the shards it reads, and no others
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        reads.clear()
        ds = StreamingDataset(out, where="text_length and text_chars<250", shuffle=False)
        ids = ds.epoch_plan(0).ids(0, len(ds))
        assert len(list(ds)) == len(ds)
        assert sorted(set(reads)) == sorted(set(locate(ids, ds.reader.offsets)[0].tolist()))
    # An expression not stored is counted from every table once, when the dataset is made.
    reads.clear()
    StreamingDataset(out, where="text_chars > 10")
    assert sorted(reads) == list(range(len(load_manifest(out).shards_of())))


def test_build_annotate_with_dedup_marks_what_dedup_removes(tmp_path):
    import random

    r = random.Random(3)
    docs = [" ".join(f"w{r.randint(0, 999)}" for _ in range(r.randint(40, 80))) for _ in range(150)]
    docs[20] = docs[4]  # an exact copy
    docs[90] = docs[9].replace(docs[9].split()[5], "changed", 1)  # a near copy
    (tmp_path / "raw").mkdir()
    with open(tmp_path / "raw" / "docs.jsonl", "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    removed = make(tmp_path, "removed", dedup=True)
    marked = make(tmp_path, "marked", dedup=True, annotate=True)
    kept = [s["__key__"] for s in StreamingDataset(marked, where="not duplicate", shuffle=False)]
    assert kept == [s["__key__"] for s in StreamingDataset(removed, shuffle=False)] and len(kept) <= 148
    rows = {s["__key__"]: s for s in StreamingDataset(marked, shuffle=False, fields=["txt"])}
    assert len(rows) == 150
    ds = StreamingDataset(marked, where="exact_dup", shuffle=False)
    assert "docs/000021" in [s["__key__"] for s in ds]
    same = StreamingDataset(marked, where=f"near_dup_cluster == {key_hash('docs/000010')}", shuffle=False)
    assert {s["__key__"] for s in same} == {"docs/000010", "docs/000091"}
    assert load_manifest(marked).build["dedup"]["marked"] == 150 - len(kept)


def test_build_annotate_same_bytes_at_0_and_2_workers_and_a_rerun_writes_nothing(corpus, monkeypatch):
    tmp, _ = corpus
    a = make(tmp, "a", filter="text-length", annotate=True)
    out = tmp / "b"
    cfg = BuildConfig(str(tmp / "raw"), str(out), max_samples_per_shard=37, workers=2, progress=False,
                      filter="text-length", annotate=True)
    build(cfg)
    assert files(a, "attributes").keys() == files(str(out), "attributes").keys()
    assert [v[0] for v in files(a, "attributes").values()] == [v[0] for v in files(str(out), "attributes").values()]
    assert open(f"{a}/manifest.json").read() == open(f"{out}/manifest.json").read()
    tables = files(str(out), "attributes")
    assert build(cfg).reused_shards == len(tables)
    assert files(str(out), "attributes") == tables
    run(str(out), select=("text_length",))  # a selection stored: the tables stay the build's
    assert build(cfg).reused_shards == len(tables)
    monkeypatch.setitem(filters.FILTERS, "words", Words)
    run(str(out), "words")  # the tables gain a column: the next build writes its shards again, with its tables
    assert build(cfg).reused_shards == 0
    assert [v[0] for v in files(str(out), "attributes").values()] == [v[0] for v in tables.values()]


def test_verify_checks_attribute_tables(corpus):
    tmp, _ = corpus
    out = make(tmp, filter="text-length", annotate=True)
    ok = CliRunner().invoke(main, ["verify", out])
    assert ok.exit_code == 0 and "ok:" in ok.output
    path = os.path.join(out, "attributes", "data-00002.parquet")
    data = bytearray(open(path, "rb").read())
    data[40] ^= 1
    open(path, "wb").write(bytes(data))
    bad = CliRunner().invoke(main, ["verify", out])
    assert bad.exit_code == 1 and "attributes/data-00002.parquet" in bad.output and "sha256" in bad.output
    with pytest.raises(ShardError, match="does not match the manifest"):
        list(StreamingDataset(out, where="text_length"))


def test_attributes_of_other_shard_content_are_refused(corpus):
    tmp, _ = corpus
    out = make(tmp)
    run(out)
    old = json.loads(open(f"{out}/manifest.json").read())["attributes"]
    shutil.rmtree(tmp / "raw")
    write_corpus(tmp / "raw", 300, seed=9)  # same keys, other texts
    make(tmp)
    d = json.loads(open(f"{out}/manifest.json").read())
    d["attributes"] = old  # a manifest that names the old tables beside the new shards
    open(f"{out}/manifest.json", "w").write(json.dumps(d))
    with pytest.raises(ManifestError, match="computed from other shard content"):
        StreamingDataset(out, where="text_length")
    assert run(out).written == len(load_manifest(out).shards_of())  # annotate brings them up to date
    assert len(StreamingDataset(out, where="text_length")) > 0


def test_cli_annotate_and_its_errors(corpus):
    tmp, _ = corpus
    out = make(tmp)
    result = CliRunner().invoke(main, ["annotate", out, "--scorers", "text-length", "--workers", "0", "--no-progress",
                                       "--select", "text_length"])
    assert result.exit_code == 0, result.output
    assert "text_length          bool" in result.output and "samples: text_length" in result.output
    for args, says in ((["--scorers", "nope"], "expected a comma-separated list of c4, fasttext, fineweb"),
                       ([], "nothing to do"), (["--select", "lang == 'en'"], "no attribute column 'lang'")):
        bad = CliRunner().invoke(main, ["annotate", out, "--workers", "0", *args])
        assert bad.exit_code == 1 and says in bad.output, bad.output
    with pytest.raises(ConfigError, match="--annotate keeps every sample"):
        BuildConfig("a", "b", annotate=True)


def test_where_over_http_reads_the_attribute_tables_remotely(served, tmp_path):  # noqa: F811
    root, url, gets, _ = served
    run(root)
    local = [s["__key__"] for s in StreamingDataset(root, where="text_chars > 16", shuffle=False)]
    assert 0 < len(local) < 36
    gets.clear()
    ds = StreamingDataset(url, where="text_chars > 16", shuffle=False, cache_dir=str(tmp_path / "cache"))
    assert [s["__key__"] for s in ds] == local
    tables = [p for p in gets if p.startswith("/attributes/")]
    assert len(tables) == 4 and all(gets[p] == 1 for p in tables)  # counted when made: the masks are kept


@dataclass(frozen=True)
class Picky(Words):
    """Words that cannot score some documents."""

    name = "picky"

    @property
    def columns(self):
        import pyarrow as pa

        return {"picky": pa.bool_()}

    def score(self, text):
        if "w7 " in text:
            raise ValueError("cannot read this one")
        return {"picky": True}


def test_a_document_a_scorer_cannot_score_is_counted_and_the_run_goes_on(corpus, monkeypatch):
    tmp, texts = corpus
    monkeypatch.setitem(filters.FILTERS, "picky", Picky)
    out = make(tmp)
    result = run(out, "picky")
    bad = {k for k, t in texts.items() if "w7 " in t}
    assert result.failed == {"picky": len(bad)} and 0 < len(bad) < len(texts)
    assert f"unscored        {len(bad)} documents by picky" in annotate_summary(result)
    assert {s["__key__"] for s in StreamingDataset(out, where="picky == None")} == bad
    assert {s["__key__"] for s in StreamingDataset(out, where="picky")} == set(texts) - bad


class Masker:
    """A scorer shaped like the curation filters: its verdict left to keep(), and an edit."""

    name, prefix = "masker", "masker"

    @property
    def columns(self):
        import pyarrow as pa

        return {"masker_digits": pa.int32(), "masker": pa.bool_()}

    def score(self, text):
        return {"masker_digits": sum(ch.isdigit() for ch in text)}

    def keep(self, scores):
        return (scores["masker_digits"] < 3, None if scores["masker_digits"] < 3 else "masker: 3 digits or more")

    def edit(self, text):
        return "".join("#" if ch.isdigit() else ch for ch in text)


class Counter_:
    name = "counter"

    @property
    def columns(self):
        import pyarrow as pa

        return {"counter_digits": pa.int32(), "counter_missing": pa.int32()}

    def score(self, text):
        return {"counter_digits": sum(ch.isdigit() for ch in text)} | ({"counter_missing": 1} if "x" in text else {})

    def keep(self, scores):
        return True, None


def test_scores_chain_edits_fill_verdicts_and_count_what_a_scorer_cannot_give():
    from shardkit.stages.attributes import score_texts

    got = score_texts(["a1 b2", "12345 x", None, "no digits"], [Masker(), Counter_()])
    cols = {c: a.to_pylist() for c, a in got.columns.items()}
    assert cols["masker_digits"] == [2, 5, None, 0] and cols["masker"] == [True, False, None, True]
    assert cols["counter_digits"] == [None, 0, None, None]  # it saw the masked text; 3 of its rows lack a column
    assert cols["counter_missing"] == [None, 1, None, None]
    assert got.keep.tolist() == [True, False, True, True] and got.rules[1] == "masker: 3 digits or more"
    assert got.failed == {"counter": 2}


def test_annotate_of_a_url_says_that_out_must_be_local_and_how():
    from shardkit.cli import main

    result = CliRunner().invoke(main, ["annotate", "s3://bucket/ds", "--scorers", "text-length"])
    assert result.exit_code == 1 and "must be a local folder" in result.output and "copy the dataset there" in result.output
