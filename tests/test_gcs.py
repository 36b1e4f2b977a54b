"""gs:// on a local Google Cloud Storage server (fake-gcs-server): build, dedup and verify give what
they give on a local disk, with obstore reading (GETs, ranges, listing) and gcsfs writing
(objstore.WRITES), and through gcsfs alone (SHARDKIT_OBJECT_CLIENT=fsspec); a training script's
workers read a dataset there on obstore; one job holds an OUT; faults are retried within --retries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from gcs_store import fake_gcs, gcs  # noqa: F401 — the fixtures
from moto_store import plant_duplicates, raw, same_files  # noqa: F401 — raw: the fixture

from shardkit.cli import main
from shardkit.config import BuildConfig, DedupConfig
from shardkit.jobs.build import build

OPTIONS = dict(workers=0, image_size=48, progress=False, max_samples_per_shard=6)
ROOT = Path(__file__).resolve().parent.parent
READ_WITH_WORKERS = """
import json, sys
from shardkit import StreamingDataset, make_loader
ds = StreamingDataset(sys.argv[1], cache_dir=sys.argv[2], fields=["jpg", "cls"], shuffle=False)
print(json.dumps(sorted([k, repr(c), None if x is None else float(x.float().mean())]
                        for batch in make_loader(ds, batch_size=4, num_workers=2)
                        for k, c, x in zip(batch["__key__"], batch["cls"], batch["jpg"]))))
"""


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _client(monkeypatch, client: str) -> None:
    from shardkit.store.remote import forget_filesystems

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    forget_filesystems()


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_build_gs_to_gs_is_byte_identical_to_local_and_a_rerun_writes_nothing(raw, tmp_path, gcs, monkeypatch, client):
    from shardkit.store import objstore

    _client(monkeypatch, client)
    assert objstore.serves(gcs.url("out")) == (client == "obstore") and not objstore.writes(gcs.url("out"))
    local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
    src, out = gcs.upload(raw, "raw"), gcs.url("out")
    remote = build(BuildConfig(src, out, **OPTIONS))
    assert remote.samples == local.samples and len(remote.rejections) == len(local.rejections) > 0
    assert same_files(str(tmp_path / "local"), gcs.download("out", str(tmp_path / "got"))) == []
    assert not any(k.endswith("lease") for k in gcs.objects("out"))  # released at the end
    reads = gcs.clients("GET", "raw/")  # the source objects: obstore's GETs, else gcsfs's
    assert reads == ({"obstore"} if client == "obstore" else {"gcsfs"}), gcs.proxy.seen[:5]
    assert gcs.writers() == {"gcsfs"}  # the shards, the lease: gcsfs's writes either way
    written = gcs.objects("out")
    again = build(BuildConfig(src, out, **OPTIONS))
    assert again.reused_shards == len(remote.shards) > 0
    assert {k: v for k, v in gcs.objects("out").items() if k.startswith("shards/")} == \
        {k: v for k, v in written.items() if k.startswith("shards/")}  # no shard written again
    for mixed in ((raw, gcs.url("mixed")), (src, str(tmp_path / "mixed"))):  # local -> gs, gs -> local
        build(BuildConfig(*mixed, **OPTIONS))
    assert same_files(str(tmp_path / "local"), gcs.download("mixed", str(tmp_path / "got-mixed"))) == []
    assert same_files(str(tmp_path / "local"), str(tmp_path / "mixed")) == []


def test_a_build_on_the_embedded_cluster_writes_what_one_process_writes(raw, tmp_path, gcs):
    local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
    remote = build(BuildConfig(gcs.upload(raw, "raw"), gcs.url("out"), **{**OPTIONS, "workers": 2}))
    assert remote.samples == local.samples
    assert same_files(str(tmp_path / "local"), gcs.download("out", str(tmp_path / "got"))) == []


def test_a_dataset_on_gs_reads_as_on_disk_with_its_workers_on_obstore_and_verify_finds_faults(raw, tmp_path, gcs):
    build(BuildConfig(raw, str(tmp_path / "ds"), **OPTIONS))
    url = gcs.upload(str(tmp_path / "ds"), "ds")

    def keys(root, cache):  # in a process of its own, as a training script: no call here started obstore
        out = subprocess.run([sys.executable, "-c", READ_WITH_WORKERS, root, str(tmp_path / cache)],
                             capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    local = keys(str(tmp_path / "ds"), "c0")
    gcs.proxy.seen.clear()
    assert keys(url, "c1") == local and len(local) > 0
    assert "obstore" in gcs.clients("GET", "ds/shards/")  # the workers' reads (the main process's early
    # reads of the first batches' indexes are gcsfs's: it starts no runtime before forking them)
    assert gcs.writers() == set()
    result = run("verify", url)
    assert result.exit_code == 0 and "ok:" in result.output, result.output
    planned = run("plan", url, "--rate", "1000", "--out", tmp_path / "plan")
    assert planned.exit_code == 0 and "round trip" in planned.output, planned.output  # the store probed
    assert run("show", url, local[0][0], "--cache-dir", tmp_path / "c2").exit_code == 0
    manifest = json.loads(gcs.get("ds/manifest.json"))
    first, second = manifest["shards"][0]["path"], manifest["shards"][1]
    gcs.delete(f"ds/{first}")
    gcs.put(f"ds/{second['path']}", b"x" * second["bytes"])
    result = run("verify", url)
    assert result.exit_code == 1
    assert f"missing   {first}" in result.output and f"checksum  {second['path']}" in result.output


def test_dedup_gs_to_gs_keeps_what_local_dedup_keeps(raw, tmp_path, gcs):
    from shardkit.jobs.dedup import dedup

    plant_duplicates(raw)
    src = gcs.upload(raw, "raw")
    local = dedup(DedupConfig(raw, str(tmp_path / "local"), workers=0, progress=False))
    remote = dedup(DedupConfig(src, gcs.url("dedup"), workers=0, progress=False))
    assert local.summary["removed"] == remote.summary["removed"] >= 2
    got = gcs.download("dedup", str(tmp_path / "got"))
    assert same_files(str(tmp_path / "local"), got) == ["dedup/summary.json"]  # its timings differ


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_one_job_holds_an_out_a_second_exits_3_and_a_stale_lease_is_taken_over(tmp_path, gcs, monkeypatch, client):
    """gcsfs's create-only write (ifGenerationMatch=0) guards the lease on either client."""
    import socket
    import time

    from shardkit.errors import FolderLocked
    from shardkit.store import lease as L

    _client(monkeypatch, client)
    out = gcs.url("out")
    first = L.Lease(out, "shardkit build")
    first.take()
    try:
        assert first.guarded
        result = run("build", os.path.dirname(__file__), out, "--workers", "0", "--no-progress")
        assert result.exit_code == 3 and "is being written by `shardkit build`" in result.stderr
    finally:
        first.release()
    assert gcs.objects("out") == {}
    held = {"command": "shardkit build", "pid": 1, "host": "elsewhere", "since": "2020-01-01 00:00:00 +0000",
            "token": "x", "refreshed": time.time(), "ttl": L.TTL}
    gcs.put("out/.shardkit/lease", json.dumps(held).encode())  # a live holder on another host
    with pytest.raises(FolderLocked):
        L.Lease(out, "shardkit build").take()
    gone = {**held, "pid": 2 ** 22 + 7, "host": socket.gethostname()}  # a process gone from this host
    gcs.put("out/.shardkit/lease", json.dumps(gone).encode())
    lease = L.Lease(out, "shardkit build")
    lease.take()
    assert json.loads(gcs.get("out/.shardkit/lease"))["pid"] == os.getpid()
    lease.release()
    assert gcs.objects("out") == {}


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_store_that_answers_503_or_resets_is_retried_within_retries_then_one_line(raw, tmp_path, gcs, monkeypatch,
                                                                                    client):
    _client(monkeypatch, client)
    local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
    src = gcs.upload(raw, "raw")
    victims = ("raw/cat/000001.jpg", "raw/dog/000003.jpg")
    paths = [f"/{gcs.bucket}/{key}" if client == "obstore" else f"/download/storage/v1/b/{gcs.bucket}/o/{key}"
             for key in victims]
    for path in paths:
        gcs.proxy.plan(path, [503, "reset"])  # two faults, then the object: passes with --retries 2
    remote = build(BuildConfig(src, str(tmp_path / "out"), retries=2, **OPTIONS))
    assert remote.samples == local.samples
    assert same_files(str(tmp_path / "local"), str(tmp_path / "out")) == []
    for path in paths:
        assert gcs.proxy.planned[path] == [] and gcs.proxy.tries(path) >= 3

    url = gcs.upload(str(tmp_path / "local"), "ds")
    shard = json.loads((tmp_path / "local" / "manifest.json").read_text())["shards"][0]["path"]
    path = f"/{gcs.bucket}/ds/{shard}" if client == "obstore" else f"/download/storage/v1/b/{gcs.bucket}/o/ds/{shard}"
    gcs.proxy.plan(path, [503] * 10)
    gcs.proxy.seen.clear()
    result = run("verify", url, "--retries", "1", "--timeout", "5")
    assert result.exit_code == 1, result.output
    line = [l for l in result.output.splitlines() if shard in l]
    assert line and "503" in line[0], result.output
    assert gcs.proxy.tries(path) == 2, (gcs.proxy.seen, result.output)  # a try, a retry


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_missing_bucket_fails_in_one_line_naming_the_url(raw, tmp_path, gcs, monkeypatch, client):
    _client(monkeypatch, client)
    for args in (["build", "gs://no-such-bucket/raw", tmp_path / "out"], ["build", raw, "gs://no-such-bucket/out"],
                 ["verify", "gs://no-such-bucket/ds"]):
        result = CliRunner().invoke(main, [str(a) for a in args] + (["--workers", "0", "--no-progress"]
                                                                   if args[0] == "build" else []))
        assert result.exit_code in (1, 2) and result.stderr.strip().count("\n") == 0, (client, args, result.output)
        assert "gs://no-such-bucket" in result.stderr and "Traceback" not in result.output, result.output


@pytest.fixture(scope="module")
def gs_cluster(fake_gcs, tmp_path_factory):
    """`dask scheduler` and two `dask worker` processes, each in a folder of its own (no shared disk),
    the emulator reached straight through the STORAGE_EMULATOR_HOST they inherit."""
    from gcs_store import GCS, new_bucket
    from test_object_store_cluster import store_cluster

    server = GCS(fake_gcs.endpoint, f"cluster{os.getpid()}")
    new_bucket(fake_gcs.endpoint, server.bucket)
    with store_cluster(tmp_path_factory.mktemp("gs-cluster"), "GOOGLE_",
                       {"STORAGE_EMULATOR_HOST": fake_gcs.endpoint}) as cluster:
        yield {**cluster, "gcs": server}


def test_gs_to_gs_on_dask_workers_without_a_shared_disk_then_kill_9_and_rerun(gs_cluster, tmp_path):
    """The workers read and write only through the store; kill -9 of the client mid-build leaves
    nothing named half-written, and the rerun (taking the lease over) gives the local build's bytes."""
    from test_object_store_cluster import build_then_kill_9_and_rerun

    build_then_kill_9_and_rerun(gs_cluster, gs_cluster["gcs"], tmp_path)


@pytest.mark.timeout(120)
def test_a_write_to_a_store_that_stops_reading_ends_within_its_bound(monkeypatch):
    """gcsfs's own waits are per read of the answer: sending a body to a store that stops reading
    it would wait for ever. The lean client's fallback gives gcsfs the call's bound as a whole
    (2 x timeout + the body at 1 MB/s), as store.calls.bound gives it to fsspec's own calls."""
    import socket
    import threading
    import time

    from shardkit import store
    from shardkit.store.calls import WriteError
    from shardkit.store.remote import RemotePolicy

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(listener.accept()) for _ in range(8)], daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{listener.getsockname()[1]}")
    _client(monkeypatch, "obstore")
    t = time.monotonic()
    try:
        with pytest.raises(WriteError, match="cannot write gs://stuck/x.bin"):
            store.write("gs://stuck/x.bin", b"x" * (8 << 20), policy=RemotePolicy(timeout=1.0, retries=0))
    finally:
        listener.close()
        for connection, _ in held:
            connection.close()
    assert time.monotonic() - t < 2 * 1.0 + 8 + 10
