"""az:// on a local Azure Blob server (Azurite): build, dedup and verify give what they give on a local
disk, through obstore's client on the hot paths and through adlfs alone (SHARDKIT_OBJECT_CLIENT=fsspec);
a training script reads a dataset there with its workers on obstore; one job holds an OUT; no
credential appears in any output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from azurite_store import KEY, azure, azurite, faults  # noqa: F401 — the fixtures
from click.testing import CliRunner
from moto_store import plant_duplicates, raw, same_files  # noqa: F401 — raw: the fixture

from shardkit.cli import main
from shardkit.config import BuildConfig, DedupConfig
from shardkit.jobs.build import build

OPTIONS = dict(workers=0, image_size=48, progress=False, max_samples_per_shard=6)
ROOT = Path(__file__).resolve().parent.parent


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_build_az_to_az_is_byte_identical_to_local_and_a_rerun_writes_nothing(raw, tmp_path, azure, monkeypatch,
                                                                            client):
    from shardkit.store import objstore
    from shardkit.store.remote import forget_filesystems

    if client == "fsspec":
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    forget_filesystems()
    assert objstore.serves(azure.url("out")) == (client == "obstore")
    local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
    src, out = azure.upload(raw, "raw"), azure.url("out")
    remote = build(BuildConfig(src, out, **OPTIONS))
    assert remote.samples == local.samples and len(remote.rejections) == len(local.rejections) > 0
    assert same_files(str(tmp_path / "local"), azure.download("out", str(tmp_path / "got"))) == []
    assert not any(k.endswith("lease") for k in azure.objects("out"))  # released at the end
    written = azure.objects("out")
    again = build(BuildConfig(src, out, **OPTIONS))
    assert again.reused_shards == len(remote.shards) > 0
    assert {k: v for k, v in azure.objects("out").items() if k.startswith("shards/")} == \
        {k: v for k, v in written.items() if k.startswith("shards/")}  # no shard written again
    for mixed in ((raw, azure.url("mixed")), (src, str(tmp_path / "mixed"))):  # local -> az, az -> local
        build(BuildConfig(*mixed, **OPTIONS))
    assert same_files(str(tmp_path / "local"), azure.download("mixed", str(tmp_path / "got-mixed"))) == []
    assert same_files(str(tmp_path / "local"), str(tmp_path / "mixed")) == []
    from shardkit.store import remote

    made = {key[1] for key in remote._FS}  # the fsspec filesystems this process made
    assert ("az" in made) == (client == "fsspec")  # on obstore, a job's calls build no adlfs client


def test_a_build_on_the_embedded_cluster_writes_what_one_process_writes(raw, tmp_path, azure):
    local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
    remote = build(BuildConfig(azure.upload(raw, "raw"), azure.url("out"), **{**OPTIONS, "workers": 2}))
    assert remote.samples == local.samples
    assert same_files(str(tmp_path / "local"), azure.download("out", str(tmp_path / "got"))) == []


def test_a_dataset_on_az_reads_as_on_disk_with_workers_verify_and_show(raw, tmp_path, azure):
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    build(BuildConfig(raw, str(tmp_path / "ds"), **OPTIONS))
    url = azure.upload(str(tmp_path / "ds"), "ds")
    result = run("verify", url)
    assert result.exit_code == 0 and "ok:" in result.output, result.output
    assert run("inspect", url).exit_code == 0
    planned = run("plan", url, "--rate", "1000", "--out", tmp_path / "plan")
    assert planned.exit_code == 0 and "round trip" in planned.output, planned.output  # the store probed

    def keys(root, cache):
        ds = StreamingDataset(root, cache_dir=str(tmp_path / cache), fields=["jpg", "cls"], shuffle=False)
        return sorted((k, repr(c), None if x is None else float(x.float().mean()))
                      for batch in make_loader(ds, batch_size=4, num_workers=2)
                      for k, c, x in zip(batch["__key__"], batch["cls"], batch["jpg"]))

    local = keys(str(tmp_path / "ds"), "c0")
    assert keys(url, "c1") == local and len(local) > 0  # the main process on adlfs, its workers on obstore
    assert run("show", url, local[0][0], "--cache-dir", tmp_path / "c2").exit_code == 0
    manifest = json.loads(azure.fs().cat_file(f"{azure.container}/ds/manifest.json"))
    first, second = manifest["shards"][0]["path"], manifest["shards"][1]
    fs = azure.fs()
    fs.rm_file(f"{azure.container}/ds/{first}")
    fs.pipe_file(f"{azure.container}/ds/{second['path']}", b"x" * second["bytes"])
    result = run("verify", url)
    assert result.exit_code == 1
    assert f"missing   {first}" in result.output and f"checksum  {second['path']}" in result.output


def test_dedup_az_to_az_keeps_what_local_dedup_keeps(raw, tmp_path, azure):
    from shardkit.jobs.dedup import dedup

    plant_duplicates(raw)
    src = azure.upload(raw, "raw")
    local = dedup(DedupConfig(raw, str(tmp_path / "local"), workers=0, progress=False))
    remote = dedup(DedupConfig(src, azure.url("dedup"), workers=0, progress=False))
    assert local.summary["removed"] == remote.summary["removed"] >= 2
    got = azure.download("dedup", str(tmp_path / "got"))
    assert same_files(str(tmp_path / "local"), got) == ["dedup/summary.json"]  # its timings differ
    build(BuildConfig(src, azure.url("ds"), **OPTIONS))  # a built dataset there, deduplicated into another folder
    dedup(DedupConfig(azure.url("ds"), azure.url("ds-dedup"), workers=0, progress=False))
    build(BuildConfig(raw, str(tmp_path / "ds"), **OPTIONS))
    dedup(DedupConfig(str(tmp_path / "ds"), str(tmp_path / "ds-dedup"), workers=0, progress=False))
    got = azure.download("ds-dedup", str(tmp_path / "got-ds"))
    assert same_files(str(tmp_path / "ds-dedup"), got) == ["dedup/summary.json"]


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_second_job_on_the_same_out_exits_3(tmp_path, azure, monkeypatch, client):
    from shardkit.store import lease as L

    if client == "fsspec":
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    out = azure.url("out")
    first = L.Lease(out, "shardkit build")
    first.take()
    try:
        result = run("build", os.path.dirname(__file__), out, "--workers", "0", "--no-progress")
        assert result.exit_code == 3 and "is being written by `shardkit build`" in result.stderr
        first.refresh() if hasattr(first, "refresh") else None
    finally:
        first.release()
    assert not any(k.endswith("lease") for k in azure.objects("out"))
    again = L.Lease(out, "shardkit dedup")
    again.take()  # free again
    again.release()


def _account_sas(**permissions) -> str:
    import datetime as dt

    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    from azurite_store import ACCOUNT

    now = dt.datetime.now(dt.timezone.utc)
    return generate_account_sas(ACCOUNT, KEY, ResourceTypes(service=True, container=True, object=True),
                                AccountSasPermissions(**permissions), expiry=now + dt.timedelta(hours=1),
                                start=now - dt.timedelta(minutes=5))


def test_a_build_under_a_sas_on_obstore_deletes_where_azure_refuses_a_batch(raw, tmp_path, azure, monkeypatch):
    """obstore deletes through Blob Batch, which Azurite answers with 500 under a SAS: the lease's
    release and the clean-up of OUT then go through adlfs, a DELETE a key (objstore.BulkRefused)."""
    from shardkit.store import objstore

    sas = _account_sas(read=True, write=True, list=True, create=True, add=True, delete=True)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"BlobEndpoint={azure.endpoint};SharedAccessSignature={sas}")
    assert objstore.serves(azure.url("out"))
    local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
    for _ in range(2):  # the second: a rerun that writes no shard
        remote = build(BuildConfig(raw, azure.url("out"), **OPTIONS))
        assert remote.samples == local.samples
    assert remote.reused_shards == len(remote.shards) > 0
    assert same_files(str(tmp_path / "local"), azure.download("out", str(tmp_path / "got"))) == []
    assert not any(k.endswith("lease") for k in azure.objects("out"))
    from shardkit import store

    fs = azure.fs()
    for name in ("a[1].bin", "a1.bin", "b*.bin", "c?.bin", "d/e.bin"):  # names a glob would read otherwise
        fs.pipe_file(f"{azure.container}/tree/{name}", b"1")
    store.remove_tree(azure.url("tree"))
    assert azure.objects("tree") == {}


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_delete_the_store_refuses_says_delete_in_one_line(azure, monkeypatch, client):
    from shardkit import store
    from shardkit.store.calls import WriteError
    from shardkit.store.remote import forget_filesystems

    azure.fs().pipe_file(f"{azure.container}/x/a.bin", b"1")
    sas = _account_sas(read=True, write=True, list=True, create=True)  # no delete
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"BlobEndpoint={azure.endpoint};SharedAccessSignature={sas}")
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    forget_filesystems()
    with pytest.raises(WriteError) as e:
        store.remove(azure.url("x/a.bin"))
    said = str(e.value)
    assert said.startswith(f"cannot delete {azure.url('x/a.bin')}: HTTP 403 Forbidden") and "\n" not in said, said
    assert "sig=" not in said and sas.split("sig=")[-1][:12] not in said
    assert azure.fs().cat_file(f"{azure.container}/x/a.bin") == b"1"


@pytest.mark.parametrize("form", ["sas only", "lower case"])
def test_a_connection_string_is_read_as_azures_sdk_reads_it(azure, monkeypatch, form):
    """A SAS-only string (the portal's form: its account is in BlobEndpoint) and keys in lower case
    serve obstore as they serve adlfs."""
    from shardkit import store
    from shardkit.store import objstore
    from shardkit.store.remote import forget_filesystems

    sas = _account_sas(read=True, write=True, list=True, create=True)
    if form == "sas only":
        connection = f"BlobEndpoint={azure.endpoint};SharedAccessSignature={sas}"
    else:
        connection = azure.connection_string.replace("AccountName", "accountname").replace("AccountKey", "accountkey")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    for client in ("obstore", "fsspec"):
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
        forget_filesystems()
        assert objstore.serves(azure.url("x")) == (client == "obstore")
        store.write(azure.url(f"{client}/a.bin"), b"abc" * 1000)
        assert store.read(azure.url(f"{client}/a.bin")) == b"abc" * 1000


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_stale_lease_is_taken_over_and_a_live_one_kept(azure, monkeypatch, caplog, client):
    import socket
    import time

    from shardkit.errors import FolderLocked
    from shardkit.store import lease as L

    if client == "fsspec":
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    fs, path = azure.fs(), f"{azure.container}/out/.shardkit/lease"
    held = {"command": "shardkit build", "pid": 1, "host": "elsewhere", "since": "2020-01-01 00:00:00 +0000",
            "token": "x", "refreshed": time.time(), "ttl": L.TTL}
    fs.pipe_file(path, json.dumps(held).encode())  # a live holder on another host
    with pytest.raises(FolderLocked):
        L.Lease(azure.url("out"), "shardkit build").take()
    gone = {**held, "pid": 2 ** 22 + 7, "host": socket.gethostname()}  # a process gone from this host
    fs.pipe_file(path, json.dumps(gone).encode())
    lease = L.Lease(azure.url("out"), "shardkit build")
    lease.take()
    assert json.loads(fs.cat_file(path))["pid"] == os.getpid()
    lease.release()
    assert not fs.exists(path)


def test_a_wrong_key_or_a_missing_container_fails_in_one_line_without_the_secret(raw, tmp_path, azure):
    src = azure.upload(raw, "raw")
    wrong = "A" * 86 + "=="
    bad = azure.connection_string.replace(KEY, wrong)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    job = ["--workers", "0", "--no-progress"]
    cases = [(bad, ["build", src, str(tmp_path / "out"), *job], "HTTP 403 Forbidden (AuthorizationFailure)"),
             (bad, ["build", str(raw), azure.url("out"), *job], "HTTP 403 Forbidden (AuthorizationFailure)"),
             (bad, ["verify", azure.url("ds")], "HTTP 403 Forbidden (AuthorizationFailure)"),
             (azure.connection_string, ["build", str(raw), "az://no-such-container/out", *job],
              "HTTP 404 Not Found (ContainerNotFound)"),
             (None, ["build", src, str(tmp_path / "out2"), *job], "AZURE_STORAGE_CONNECTION_STRING"),
             (f"AccountKey={wrong}", ["build", src, str(tmp_path / "out3"), *job], "names no account"),
             (bad.replace(azure.endpoint, "not a url"), ["verify", azure.url("ds")], "not a url")]
    for client in ("obstore", "fsspec"):
        env["SHARDKIT_OBJECT_CLIENT"] = client
        for connection, args, expected in cases:
            env.pop("AZURE_STORAGE_CONNECTION_STRING", None)
            if connection is not None:
                env["AZURE_STORAGE_CONNECTION_STRING"] = connection
            proc = subprocess.run([sys.executable, "-m", "shardkit.cli", *args], capture_output=True, text=True,
                                  env=env, timeout=300)
            said = proc.stdout + proc.stderr
            assert proc.returncode in (1, 2) and proc.stderr.strip().count("\n") == 0, (client, said)
            assert expected in said and "az://" in said, (client, said)
            if expected == "not a url" and client == "obstore":  # settings, not a fault: tried once
                assert "not retried" in said, said
            assert wrong not in said and KEY not in said and wrong[:20] not in said, said
        for file in Path(tmp_path).rglob("*"):
            if file.is_file():
                assert wrong.encode() not in file.read_bytes() and KEY.encode() not in file.read_bytes()


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_store_that_answers_503_or_resets_is_retried_within_retries_then_one_line(raw, tmp_path, azure, faults,
                                                                                    monkeypatch, client):
    if client == "fsspec":
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
    src = azure.upload(raw, "raw")  # straight to Azurite; the jobs below go through the proxy
    victims = [f"/devstoreaccount1/{azure.container}/raw/{name}" for name in ("cat/000001.jpg", "dog/000003.jpg")]
    for path in victims:
        faults.plan(path, [503, "reset"])  # two faults, then the object: passes with --retries 2
    remote = build(BuildConfig(src, str(tmp_path / "out"), retries=2, **{**OPTIONS, "workers": 0}))
    assert remote.samples == local.samples
    assert same_files(str(tmp_path / "local"), str(tmp_path / "out")) == []
    for path in victims:
        assert faults.planned[path] == [] and faults.tries(path) >= 3

    url = azure.upload(str(tmp_path / "local"), "ds")
    shard = json.loads((tmp_path / "local" / "manifest.json").read_text())["shards"][0]["path"]
    path = f"/devstoreaccount1/{azure.container}/ds/{shard}"
    faults.plan(path, [503] * 10)
    faults.seen.clear()
    result = run("verify", url, "--retries", "1", "--timeout", "5")
    assert result.exit_code == 1, result.output
    line = [l for l in result.output.splitlines() if shard in l]
    assert line and "503" in line[0], result.output
    assert faults.tries(path) == 2, (faults.seen, result.output)  # a try, one retry


@pytest.fixture(scope="module")
def az_cluster(azurite, tmp_path_factory):
    """`dask scheduler` and two `dask worker` processes, each in a folder of its own (no shared disk),
    the Azurite container reachable through the connection string they inherit."""
    from azurite_store import Azure
    from test_object_store_cluster import store_cluster

    server = Azure(azurite.endpoint, f"cluster{os.getpid()}", azurite)
    with store_cluster(tmp_path_factory.mktemp("az-cluster"), "AZURE_",
                       {"AZURE_STORAGE_CONNECTION_STRING": server.connection_string}) as cluster:
        server.fs().mkdir(server.container)
        yield {**cluster, "azure": server}


def test_az_to_az_on_dask_workers_without_a_shared_disk_then_kill_9_and_rerun(az_cluster, tmp_path):
    """The workers read and write only through the store; kill -9 of the client mid-build leaves
    nothing named half-written, and the rerun (taking the lease over) gives the local build's bytes."""
    from test_object_store_cluster import build_then_kill_9_and_rerun

    build_then_kill_9_and_rerun(az_cluster, az_cluster["azure"], tmp_path)
