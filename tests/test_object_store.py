"""SRC and OUT on a store (a local S3 server): build, dedup, build_map, ShardWriter and verify give what
they give on a local disk, a rerun writes nothing it need not, one job holds an OUT, a stalled store
fails naming the URL. Jobs run in this process here (workers=0); tests/test_object_store_cluster.py
runs them on a Dask cluster of separate processes without a shared disk."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from moto_store import BUCKET, plant_duplicates, raw, s3, same_files  # noqa: F401 — s3, raw: the fixtures

from shardkit.cli import main
from shardkit.config import BuildConfig, DedupConfig
from shardkit.jobs.build import build

OPTIONS = dict(workers=0, image_size=48, progress=False, max_samples_per_shard=6)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_build_s3_to_s3_is_byte_identical_to_local(raw, tmp_path, s3):
    local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
    remote = build(BuildConfig(s3.upload(raw, "raw"), s3.url("out"), **OPTIONS))
    assert remote.samples == local.samples and len(remote.rejections) == len(local.rejections) > 0
    got = s3.download("out", str(tmp_path / "got"))
    assert same_files(str(tmp_path / "local"), got) == []
    assert "lease" not in s3.keys("out/.shardkit")  # released at the end
    for mixed in ((raw, s3.url("mixed")), (s3.url("raw"), str(tmp_path / "mixed"))):  # local -> s3, s3 -> local
        build(BuildConfig(*mixed, **OPTIONS))
    assert same_files(str(tmp_path / "local"), s3.download("mixed", str(tmp_path / "got-mixed"))) == []
    assert same_files(str(tmp_path / "local"), str(tmp_path / "mixed")) == []


def test_rerun_writes_no_shard_and_a_changed_input_rebuilds_only_its_shard(raw, tmp_path, s3):
    src, out = s3.upload(raw, "raw"), s3.url("out")
    first = build(BuildConfig(src, out, **OPTIONS))
    written = {k: n for k, n in s3.versions("out").items() if k.startswith("shards/")}
    again = build(BuildConfig(src, out, **OPTIONS))
    assert again.reused_shards == len(first.shards)
    assert {k: n for k, n in s3.versions("out").items() if k.startswith("shards/")} == written
    victim = "cat/000002.jpg"  # in one shard only: given another photo's bytes (a new ETag)
    with open(os.path.join(raw, "dog", "000002.jpg"), "rb") as f:
        s3.fs.pipe(f"{BUCKET}/raw/{victim}", f.read())
    changed = build(BuildConfig(src, out, **OPTIONS))
    rewritten = {k for k, n in s3.versions("out").items() if k.startswith("shards/") and n != written.get(k)}
    shard = next(s for s in changed.manifest.shards if s.keys[0] <= "cat/000002" <= s.keys[1])
    assert rewritten == {shard.path, shard.path + ".idx.parquet"}


def test_verify_inspect_show_and_streaming_read_a_dataset_on_s3(raw, tmp_path, s3):
    from shardkit.reader.dataset import StreamingDataset

    build(BuildConfig(raw, str(tmp_path / "ds"), **OPTIONS))
    url = s3.upload(str(tmp_path / "ds"), "ds")  # a dataset uploaded whole
    result = run("verify", url)
    assert result.exit_code == 0 and "ok:" in result.output, result.output
    assert run("inspect", url).exit_code == 0
    planned = run("plan", url, "--rate", "1000", "--out", tmp_path / "plan")
    assert planned.exit_code == 0 and "round trip" in planned.output, planned.output  # the store probed
    ds = StreamingDataset(url, cache_dir=str(tmp_path / "cache"), shuffle=False)
    key = next(iter(ds))["__key__"]
    assert run("show", url, key, "--cache-dir", tmp_path / "cache2").exit_code == 0
    manifest = json.loads(s3.fs.cat(f"{BUCKET}/ds/manifest.json"))
    first = manifest["shards"][0]["path"]
    s3.fs.rm(f"{BUCKET}/ds/{first}")
    s3.fs.pipe(f"{BUCKET}/ds/{manifest['shards'][1]['path']}", b"x" * manifest["shards"][1]["bytes"])
    result = run("verify", url)
    assert result.exit_code == 1
    assert f"missing   {first}" in result.output and f"checksum  {manifest['shards'][1]['path']}" in result.output


def test_verify_is_a_library_function(raw, tmp_path):
    from shardkit.jobs.verify import verify_dataset

    build(BuildConfig(raw, str(tmp_path / "ds"), **OPTIONS))
    assert verify_dataset(str(tmp_path / "ds")).ok
    shard = sorted((tmp_path / "ds" / "shards").glob("*.tar"))[0]
    shard.write_bytes(shard.read_bytes()[:-1024])
    report = verify_dataset(str(tmp_path / "ds"))
    assert not report.ok and report.problems == [f"size      shards/{shard.name}: {shard.stat().st_size} bytes, "
                                                 f"manifest says {shard.stat().st_size + 1024}"]


def test_dedup_s3_to_s3_keeps_what_local_dedup_keeps(raw, tmp_path, s3):
    from shardkit.jobs.dedup import dedup

    plant_duplicates(raw)
    src = s3.upload(raw, "raw")
    local = dedup(DedupConfig(raw, str(tmp_path / "local"), workers=0, progress=False))
    remote = dedup(DedupConfig(src, s3.url("dedup"), workers=0, progress=False))
    assert local.summary["removed"] == remote.summary["removed"] >= 2
    got = s3.download("dedup", str(tmp_path / "got"))
    assert same_files(str(tmp_path / "local"), got) == ["dedup/summary.json"]  # its timings differ
    # A built dataset on the store, deduplicated into another folder of it.
    build(BuildConfig(src, s3.url("ds"), **OPTIONS))
    dedup(DedupConfig(s3.url("ds"), s3.url("ds-dedup"), workers=0, progress=False))
    build(BuildConfig(raw, str(tmp_path / "ds"), **OPTIONS))
    dedup(DedupConfig(str(tmp_path / "ds"), str(tmp_path / "ds-dedup"), workers=0, progress=False))
    got = s3.download("ds-dedup", str(tmp_path / "got-ds"))
    assert same_files(str(tmp_path / "ds-dedup"), got) == ["dedup/summary.json"]


def _caption(i):
    return {"__key__": f"k{i:04d}", "txt": f"caption {i}", "cls": i % 3}


def test_build_map_and_shard_writer_write_to_s3_and_read_back(tmp_path, s3):
    from shardkit import ShardWriter, StreamingDataset, build_map

    result = build_map(_caption, list(range(40)), s3.url("mapped"), workers=0, inputs_per_shard=16, progress=False)
    assert result.samples == 40 and "shards/data-00002-000.tar" in s3.keys("mapped")
    again = build_map(_caption, list(range(40)), s3.url("mapped"), workers=0, inputs_per_shard=16, progress=False)
    assert again.reused_shards == 3
    with ShardWriter(s3.url("written"), max_samples_per_shard=15) as w:
        for i in range(40):
            w.write(_caption(i))
    for name in ("mapped", "written"):
        ds = StreamingDataset(s3.url(name), cache_dir=str(tmp_path / name), shuffle=False)
        assert sorted(s["txt"] for s in ds) == sorted(f"caption {i}" for i in range(40))
        assert "lease" not in s3.keys(f"{name}/.shardkit")


def test_build_with_map_from_and_to_s3(raw, tmp_path, s3):
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    try:
        cfg = dict(OPTIONS, map="map_fns:caption_length")
        remote = run("build", s3.upload(raw, "raw"), s3.url("out"), "--workers", "0", "--no-progress",
                     "--image-size", "48", "--max-samples-per-shard", "6", "--map", "map_fns:caption_length")
        assert remote.exit_code == 0, remote.output
        from shardkit.jobs.map.mapped_build import build_with_map

        build_with_map(BuildConfig(raw, str(tmp_path / "local"), **cfg))
    finally:
        sys.path.remove(os.path.dirname(__file__))
    got = s3.download("out", str(tmp_path / "got"))
    assert same_files(str(tmp_path / "local"), got) == []


@pytest.fixture
def stall(monkeypatch):
    """The store stops answering requests matching `stall.when(method, path)` until the test ends."""
    import threading

    from moto.server import DomainDispatcherApplication

    answer, release = DomainDispatcherApplication.__call__, threading.Event()

    class Stall:
        def when(self, method, path):
            return False

    stall = Stall()

    def stalled(self, environ, start_response):
        if stall.when(environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")):
            release.wait(60)
        return answer(self, environ, start_response)

    monkeypatch.setattr(DomainDispatcherApplication, "__call__", stalled)
    yield stall
    release.set()


def test_a_stalled_store_fails_naming_the_url_and_nothing_partial_is_named(raw, tmp_path, s3, stall):
    src = s3.upload(raw, "raw")
    stall.when = lambda method, path: method == "PUT" and "/out/shards/data-00001" in path
    result = run("build", src, s3.url("out"), "--workers", "0", "--no-progress", "--image-size", "48",
                 "--max-samples-per-shard", "6", "--timeout", "1", "--retries", "1")
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"cannot write {s3.url('out/shards/data-00001.tar')}: " in result.stderr
    assert "tried 2 time(s)" in result.stderr and "timeout 1 s" in result.stderr
    assert "--timeout/--retries allow a slower store" in result.stderr
    keys = s3.keys("out")
    assert "manifest.json" not in keys and "lease" not in s3.keys("out/.shardkit")
    for marker in (k for k in keys if k.startswith(".shardkit/done/")):  # every marker names whole objects
        for info in json.loads(s3.fs.cat(f"{BUCKET}/out/{marker}"))["result"]["shards"]:
            assert s3.fs.size(f"{BUCKET}/out/{info['path']}") == info["bytes"]
            assert "data-00001" not in info["path"]


def test_any_fsspec_store_memory(raw, tmp_path):
    """A store other than S3 (fsspec's memory://): listed one folder at a time, its lease taken with
    pipe_file(mode='create'); the same bytes as local -> local."""
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.put(raw, "/i31-raw", recursive=True)
    try:
        local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
        remote = build(BuildConfig("memory://i31-raw", "memory://i31-out", **OPTIONS))
        assert remote.samples == local.samples and len(remote.rejections) == len(local.rejections)
        fs.get("/i31-out", str(tmp_path / "got"), recursive=True)
        assert same_files(str(tmp_path / "local"), str(tmp_path / "got")) == []
        assert not fs.exists("/i31-out/.shardkit/lease")
    finally:
        fs.rm("/i31-raw", recursive=True)
        if fs.exists("/i31-out"):
            fs.rm("/i31-out", recursive=True)


def test_parquet_rows_path_only_images_and_a_tokenizer_from_s3(raw, tmp_path, s3):
    """Row files on a store: Parquet read by row group through store.open_source, an image a row names
    by path only (read beside the file), row indexes under OUT/.shardkit/scan on the store; and a
    tokenized build whose tokenizer.json the tasks read from the store."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from test_build_scale import hf_image_parquet

    hf_image_parquet(os.path.join(raw, "cat", "extra.parquet"), n=10, row_group_size=3, text_column="text")
    with open(os.path.join(raw, "cat", "000001.jpg"), "rb") as f:
        photo = f.read()
    with open(os.path.join(raw, "dog", "linked.jpg"), "wb") as f:
        f.write(photo)
    image = pa.array([{"bytes": None, "path": "linked.jpg"}], pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"image": image, "text": ["linked"]}), os.path.join(raw, "dog", "rows.parquet"))
    src = s3.upload(raw, "raw")
    options = dict(OPTIONS, format="both")
    local = build(BuildConfig(raw, str(tmp_path / "local"), **options))
    remote = build(BuildConfig(src, s3.url("out"), **options))
    assert remote.samples == local.samples and len(remote.rejections) == len(local.rejections)
    assert any(k.startswith(".shardkit/scan/") and k.endswith(".npy") for k in s3.keys("out"))
    assert same_files(str(tmp_path / "local"), s3.download("out", str(tmp_path / "got"))) == []
    # a rerun reuses every shard: the linked image (by its ETag) and the Parquet files did not change
    assert build(BuildConfig(src, s3.url("out"), **options)).reused_shards == len({s.id for s in remote.shards})
    texts = dict(workers=0, progress=False, tokenizer="bpe:300", max_samples_per_shard=50)
    build(BuildConfig(raw, str(tmp_path / "tok"), **texts))
    build(BuildConfig(src, s3.url("tok"), **texts))
    assert same_files(str(tmp_path / "tok"), s3.download("tok", str(tmp_path / "got-tok"))) == []


def _pid(_item):
    return os.getpid()


def test_with_a_scheduler_the_client_runs_no_task_itself():
    """SRC may be reachable from the cluster's workers only: with --scheduler no head start runs steps
    in the client while it connects (an embedded cluster still gets one)."""
    from distributed import LocalCluster

    from shardkit.jobs.cluster import PendingClient
    from shardkit.jobs.tasks import run_tasks

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        pending = PendingClient(cluster.scheduler_address, None, start=False)
        try:
            pids = run_tasks(_pid, list(range(6)), client=pending)
        finally:
            pending.close()
    assert len(pids) == 6 and os.getpid() not in pids


def test_a_webdataset_set_on_s3_builds_the_bytes_of_the_same_set_on_disk(tmp_path, s3):
    """WebDataset tars in a bucket (counted, indexed and read through the store by workers) build the
    same shards as the same tars on a local disk, into a store and into a folder."""
    import webdataset as wds

    from shardkit.demo.datagen import _jpeg, photo_like

    rng = __import__("numpy").random.default_rng(4)
    folder = tmp_path / "wds"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "part-%06d.tar"), maxcount=5, verbose=0) as sink:
        for i in range(12):
            sink.write({"__key__": f"{i:06d}", "jpg": _jpeg(photo_like(rng, 40, 30)), "txt": f"caption {i}",
                        "cls": i % 2})
    local = build(BuildConfig(str(folder), str(tmp_path / "local"), **OPTIONS))
    assert local.samples == 12 and not local.rejections
    src = s3.upload(str(folder), "wds")
    build(BuildConfig(src, s3.url("out"), **dict(OPTIONS, workers=2)))
    assert same_files(str(tmp_path / "local"), s3.download("out", str(tmp_path / "got"))) == []
    build(BuildConfig(src, str(tmp_path / "here"), **OPTIONS))
    assert same_files(str(tmp_path / "local"), str(tmp_path / "here")) == []
