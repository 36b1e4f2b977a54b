"""A job's timeout and retries (--timeout/--retries, config.remote_policy) reach every store call it
makes, the deep ones included (sources, markers, manifests, the dedup's partition files, the map's
staged rows), as an argument: there is no process-wide policy any more, so no call falls back to a
default and two jobs in one process cannot leak their waits into each other. Over a local S3 server
(tests/moto_store.py), jobs in this process (workers=0)."""

from __future__ import annotations

import os
import sys

import pytest
from moto_store import answers, raw, s3  # noqa: F401 — the fixtures

from shardkit import store
from shardkit.config import BuildConfig, DedupConfig
from shardkit.jobs.build import build
from shardkit.store.remote import RemotePolicy

OPTIONS = dict(workers=0, image_size=48, progress=False, max_samples_per_shard=6)
JSONL = "/shardkit-test/raw/corpus.jsonl"  # raw_folder's row file, as the S3 server sees its GETs


@pytest.fixture
def fallbacks(monkeypatch):
    """The store calls made without a policy (falling back to store.JOB_POLICY), as the URLs' callers
    see them: a list of the tracebacks' last shardkit frames."""
    import traceback

    from shardkit.store import calls, source

    seen, real = [], calls._policy

    def spy(p):
        if p is None:
            frames = [f for f in traceback.extract_stack()[:-1] if "shardkit" in f.filename]
            seen.append(" <- ".join(f"{os.path.basename(f.filename)}:{f.name}" for f in frames[-4:]))
        return real(p)

    monkeypatch.setattr(calls, "_policy", spy)
    monkeypatch.setattr(source, "_policy", spy)
    return seen


def test_the_process_wide_policy_is_gone():
    assert not hasattr(store, "use_policy") and not hasattr(store.calls, "use_policy")
    assert not hasattr(store, "policy") and not hasattr(store.calls, "_STATE")
    assert "use_policy" not in store.__all__ and "policy" not in store.__all__
    assert store.calls._policy(None) is store.JOB_POLICY  # a library caller that passes none: the defaults
    mine = RemotePolicy(timeout=3, retries=0)
    assert store.calls._policy(mine) is mine


def test_no_call_of_a_build_or_a_dedup_on_a_store_falls_back_to_a_default(raw, tmp_path, s3, fallbacks):
    src = s3.upload(raw, "raw")
    waits = dict(timeout=9.5, retries=1)
    build(BuildConfig(src, s3.url("out"), dedup=True, annotate=True, **waits, **OPTIONS))
    build(BuildConfig(src, s3.url("out"), dedup=True, annotate=True, **waits, **OPTIONS))  # a rerun: markers
    build(BuildConfig(src, s3.url("tok"), tokenizer="bpe:300", filter="c4", **waits, **OPTIONS))
    from shardkit.jobs.dedup import dedup

    dedup(DedupConfig(src, s3.url("dedup-raw"), workers=0, progress=False, **waits))
    dedup(DedupConfig(s3.url("out"), s3.url("dedup-set"), workers=0, progress=False, **waits))
    from shardkit.jobs.verify import verify_dataset

    assert verify_dataset(s3.url("out"), RemotePolicy(**waits)).ok  # its downloads too
    assert fallbacks == []


def test_no_call_of_build_map_or_build_with_map_falls_back_to_a_default(raw, tmp_path, s3, fallbacks):
    from shardkit.config.writer import MapConfig
    from shardkit.jobs.map import run_build_map
    from shardkit.jobs.map.mapped_build import build_with_map

    def caption(i):
        return {"__key__": f"k{i:04d}", "txt": f"caption {i}"}

    for _ in range(2):  # the second run reads the first one's markers
        run_build_map(caption, list(range(20)), s3.url("mapped"),
                      MapConfig(workers=0, progress=False, inputs_per_shard=8, timeout=9.5, retries=1))
    sys.path.insert(0, os.path.dirname(__file__))
    try:
        build_with_map(BuildConfig(s3.upload(raw, "raw"), s3.url("out"), map="map_fns:caption_length",
                                   timeout=9.5, retries=1, **OPTIONS))
    finally:
        sys.path.remove(os.path.dirname(__file__))
    assert fallbacks == []


def _fails_on_its_own_waits(error, url: str) -> None:
    message = str(error)
    assert url in message and "tried 1 time(s)" in message and "timeout 7.5 s" in message
    assert "shardkit build --timeout/--retries allow a slower store" in message


def test_a_build_reads_its_sources_with_its_own_policy_and_leaves_none_behind(raw, tmp_path, s3, answers):
    src = s3.upload(raw, "raw")
    answers[JSONL] = [503]  # one failure: the defaults' 2 retries pass it, retries=0 does not
    with pytest.raises(store.RemoteError) as e:
        build(BuildConfig(src, str(tmp_path / "strict"), timeout=7.5, retries=0, **OPTIONS))
    _fails_on_its_own_waits(e.value, s3.url("raw/corpus.jsonl"))  # counting the row file's lines, in its task
    assert answers[JSONL] == []
    # The first job's retries=0 stays with it: a library call after it, and a second job with the
    # defaults, in the same process, retry as theirs say (the process-wide policy kept the last job's).
    answers[JSONL] = [503]
    assert store.read(s3.url("raw/corpus.jsonl")).startswith(b"{")
    answers[JSONL] = [503]
    result = build(BuildConfig(src, str(tmp_path / "default"), **OPTIONS))
    assert result.samples > 0 and answers[JSONL] == []


def test_a_dedup_reads_its_sources_with_its_own_policy(raw, tmp_path, s3, answers):
    from shardkit.jobs.dedup import dedup

    src = s3.upload(raw, "raw")
    answers[JSONL] = [503]
    with pytest.raises(store.RemoteError) as e:
        dedup(DedupConfig(src, str(tmp_path / "strict"), workers=0, progress=False, timeout=7.5, retries=0))
    _fails_on_its_own_waits(e.value, s3.url("raw/corpus.jsonl"))
    answers[JSONL] = [503]
    assert dedup(DedupConfig(src, str(tmp_path / "default"), workers=0, progress=False)).summary["inputs"] > 0
    assert answers[JSONL] == []


def test_build_with_map_reads_the_staged_rows_with_its_own_policy(raw, tmp_path, s3, answers):
    from shardkit.jobs.map.mapped_build import STAGE, build_with_map

    src, out = s3.upload(raw, "raw"), s3.url("out")
    build(BuildConfig(src, store.join(out, STAGE), format="parquet", allow_empty=True, **OPTIONS))  # staged once
    answers[f"/shardkit-test/out/{STAGE}/shards/data-00000.parquet"] = [503]  # its first read after the build
    sys.path.insert(0, os.path.dirname(__file__))
    try:
        with pytest.raises(store.RemoteError) as e:
            build_with_map(BuildConfig(src, out, map="map_fns:caption_length", timeout=7.5, retries=0, **OPTIONS))
    finally:
        sys.path.remove(os.path.dirname(__file__))
    _fails_on_its_own_waits(e.value, store.join(out, STAGE, "shards/data-00000.parquet"))


def test_a_dedup_of_a_built_dataset_reads_its_shards_with_its_own_policy(raw, tmp_path, s3, answers):
    """The shards of a built SRC on a store are read through the reader's functions (read_shard_columns,
    the recorded sources of shard_sources): those take the job's policy too."""
    from shardkit.jobs.dedup import dedup

    src = s3.url("built")
    build(BuildConfig(raw, src, **OPTIONS))
    shard = "/shardkit-test/built/shards/data-00000.tar"
    answers[shard] = [503]
    with pytest.raises(Exception) as e:
        dedup(DedupConfig(src, str(tmp_path / "strict"), workers=0, progress=False, timeout=7.5, retries=0))
    message = str(e.value)
    assert "data-00000.tar" in message and "tried 1 time(s)" in message and "timeout 7.5 s" in message, message
    assert answers[shard] == []
    answers[shard] = [503]  # the defaults' retries pass it
    assert dedup(DedupConfig(src, str(tmp_path / "default"), workers=0, progress=False)).summary["inputs"] > 0
    assert answers[shard] == []


def test_verify_takes_timeout_and_retries_and_names_its_own_flags(raw, tmp_path, s3, answers):
    from click.testing import CliRunner

    from shardkit.cli import main

    src = s3.url("built")
    build(BuildConfig(raw, src, **OPTIONS))
    shard = "/shardkit-test/built/shards/data-00000.tar"
    answers[shard] = [503]
    got = CliRunner().invoke(main, ["verify", src, "--timeout", "7.5", "--retries", "0"])
    assert got.exit_code == 1, got.output
    assert "tried 1 time(s)" in got.output and "shardkit verify --timeout/--retries" in got.output, got.output
    answers[shard] = [503]  # the defaults' retries pass it
    got = CliRunner().invoke(main, ["verify", src])
    assert got.exit_code == 0 and got.output.startswith("ok:"), got.output
    got = CliRunner().invoke(main, ["verify", src, "--retries", "-1"])
    assert got.exit_code == 1 and "retries=-1: expected an integer >= 0 (--retries)" in got.output, got.output
