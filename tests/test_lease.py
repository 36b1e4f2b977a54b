"""One writer per OUT on a store: the lease object (conditional create, refreshed, taken over when stale)."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from click.testing import CliRunner
from moto_store import BUCKET, s3  # noqa: F401 — s3: the fixture

from shardkit.cli import main
from shardkit.errors import FolderLocked
from shardkit.store import lease as L


@pytest.fixture(autouse=True, params=["obstore", "fsspec"])
def client(request, monkeypatch):
    """Every test on both clients of s3://: obstore's (conditional PUTs of its own) and s3fs."""
    from shardkit.store import objstore

    if request.param == "obstore" and not objstore.available():
        pytest.skip("pip install 'shardkit[obstore]'")
    if request.param == "fsspec":
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    return request.param


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def record(s3, out="out") -> dict:
    return json.loads(s3.fs.cat(f"{BUCKET}/{out}/.shardkit/lease"))


def test_the_local_s3_server_honours_if_none_match(s3):
    """moto's PutObject refuses `If-None-Match: *` over an existing key (moto/s3/responses.py put_object
    raises PreconditionFailed): conditional create is tested for real here."""
    s3.client.put_object(Bucket=BUCKET, Key="x", Body=b"1", IfNoneMatch="*")
    with pytest.raises(Exception) as e:
        s3.client.put_object(Bucket=BUCKET, Key="x", Body=b"2", IfNoneMatch="*")
    assert "PreconditionFailed" in str(e.value)


def test_a_second_job_is_refused_naming_the_first(s3):
    out = s3.url("out")
    first = L.Lease(out, "shardkit build")
    first.take()
    try:
        with pytest.raises(FolderLocked) as e:
            L.Lease(out, "shardkit dedup").take()
        assert f"`shardkit build` (pid {os.getpid()} on host {socket.gethostname()}" in str(e.value)
        assert ".shardkit/lease" in str(e.value)
        result = run("build", os.path.dirname(__file__), out, "--workers", "0", "--no-progress")
        assert result.exit_code == 3 and "is being written by `shardkit build`" in result.stderr
        assert result.stderr.count("\n") == 1
    finally:
        first.release()
    assert "lease" not in s3.keys("out/.shardkit")
    again = L.Lease(out, "shardkit dedup")
    again.take()  # free again
    again.release()


def _plant(s3, **fields) -> None:
    held = {"command": "shardkit build", "pid": 1, "host": "elsewhere", "since": "2020-01-01 00:00:00 +0000",
            "token": "x", "refreshed": time.time(), "ttl": L.TTL}
    held.update(fields)
    s3.fs.pipe(f"{BUCKET}/out/.shardkit/lease", json.dumps(held).encode())


def test_a_lease_nobody_refreshes_is_taken_over_with_one_line(s3, caplog):
    _plant(s3, refreshed=time.time() - 10 * L.TTL)
    lease = L.Lease(s3.url("out"), "shardkit build")
    with caplog.at_level("WARNING", logger="shardkit.store"):
        lease.take()
    try:
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "took over the lease of `shardkit build` (pid 1 on host elsewhere" in lines[0]
        assert "not refreshed for" in lines[0]
        assert record(s3)["token"] == lease.record["token"]
    finally:
        lease.release()


def test_a_lease_of_a_process_gone_from_this_host_is_taken_over_at_once(s3, caplog):
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _plant(s3, pid=int(gone.stdout), host=socket.gethostname())  # refreshed just now, but its holder is dead
    lease = L.Lease(s3.url("out"), "shardkit build")
    with caplog.at_level("WARNING", logger="shardkit.store"):
        lease.take()
    lease.release()
    assert "has ended" in caplog.records[0].getMessage()


def test_a_live_lease_elsewhere_is_not_taken_over(s3):
    _plant(s3)  # another host, refreshed just now
    with pytest.raises(FolderLocked, match="pid 1 on host elsewhere"):
        L.Lease(s3.url("out"), "shardkit build").take()


def test_the_holder_refreshes_its_lease_and_says_so_once_it_lost_it(s3, monkeypatch, caplog):
    monkeypatch.setattr(L, "REFRESH", 0.05)
    lease = L.Lease(s3.url("out"), "shardkit build")
    lease.take()
    try:
        first = record(s3)["refreshed"]
        for _ in range(200):  # until the refresh thread rewrote it
            if record(s3)["refreshed"] != first:
                break
            time.sleep(0.05)
        assert record(s3)["refreshed"] > first
        with caplog.at_level("WARNING", logger="shardkit.store"):
            _plant(s3, refreshed=time.time())  # another job took it over (a new ETag: If-Match fails)
            for _ in range(200):  # the refresh thread marks the lease lost, then says so: wait for both
                if lease.lost is not None and caplog.records:
                    break
                time.sleep(0.05)
        assert lease.lost is not None and "taken over by `shardkit build` (pid 1" in caplog.records[-1].getMessage()
    finally:
        lease.release()
    assert record(s3)["host"] == "elsewhere"  # the new holder's lease stays


def test_a_store_without_conditional_writes_gets_one_warning(s3, monkeypatch, caplog, client):
    if client == "fsspec":
        import s3fs

        plain = s3fs.S3FileSystem._pipe_file

        async def unconditional(self, path, data, mode="overwrite", **kwargs):
            kwargs.pop("IfMatch", None)
            return await plain(self, path, data, **kwargs)  # drops mode="create": the store ignores it

        monkeypatch.setattr(s3fs.S3FileSystem, "_pipe_file", unconditional)
    else:
        import obstore

        plain = obstore.put

        def unconditional(store, key, data, mode=None, **kwargs):
            return plain(store, key, data, **kwargs)  # drops the condition: the store ignores it

        monkeypatch.setattr(obstore, "put", unconditional)
    lease = L.Lease(s3.url("out"), "shardkit build")
    with caplog.at_level("WARNING", logger="shardkit.store"):
        lease.take()
    lease.release()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "does not support conditional writes" in lines[0]
    assert not lease.guarded

