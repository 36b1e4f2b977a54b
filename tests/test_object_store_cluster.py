"""The cluster without a shared disk: one `dask scheduler` and two `dask worker` processes, each in its own
working folder with its own TMPDIR, SRC and OUT reachable only through a local S3 server. The builds
give the bytes a local build gives, reruns write nothing new, kill -9 and SIGTERM of the client leave
nothing a manifest or marker names half-written, and one job holds an OUT at a time."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tree_bytes
from moto_store import BUCKET, start_s3, stop_s3

ROOT = Path(__file__).resolve().parent.parent
SHARDKIT = str(Path(sys.executable).parent / "shardkit")
OPTS = ["--image-size", "40", "--max-samples-per-shard", "4", "--no-progress"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _own_folders(base: Path, name: str) -> dict:
    """A process's own working folder and TMPDIR: nothing is shared through a disk."""
    (base / name / "tmp").mkdir(parents=True)
    return {"cwd": str(base / name), "env": dict(os.environ, TMPDIR=str(base / name / "tmp"))}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
        mp.setenv("DASK_CONFIG", str(ROOT / "docker" / "dask"))  # as docker/compose.yml runs them
        s3 = start_s3(base, mp)
        procs = []
        try:
            address = start_cluster(base, procs)
            yield {"address": address, "s3": s3, "base": base, "clients": 0, "workers": procs[1:]}
        finally:
            for p in procs:
                _stop(p)
            stop_s3(s3)


@contextlib.contextmanager
def store_cluster(base: Path, hide: str, env: dict):
    """A cluster (start_cluster) whose processes reach a store through `env`, the host's variables
    that start with `hide` unset: {"address", "base", "clients"} for _client; stopped at the end."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith(hide)]:
            mp.delenv(name)
        for name, value in env.items():
            mp.setenv(name, value)
        mp.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
        mp.setenv("DASK_CONFIG", str(ROOT / "docker" / "dask"))
        procs = []
        try:
            yield {"address": start_cluster(base, procs), "base": base, "clients": 0}
        finally:
            for p in procs:
                _stop(p)


def start_cluster(base: Path, procs: list) -> str:
    """A `dask scheduler` and two `dask worker` processes (appended to `procs`, for _stop), each in a
    folder of its own under `base`, with this process's environment; the scheduler's address once
    both workers are up."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    procs.append(subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port",
                                   address.rsplit(":", 1)[1], "--no-dashboard"], start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **_own_folders(base, "scheduler")))
    for i in range(2):
        own = _own_folders(base, f"worker{i}")
        procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", address, "--nthreads", "1",
                                       "--nworkers", "1", "--no-dashboard", "--host", "127.0.0.1",
                                       "--local-directory", own["cwd"]], start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **own))
    _wait_for_workers(address)
    return address


def _wait_for_workers(address: str) -> None:
    from distributed import Client

    deadline = time.time() + 120
    while True:
        try:
            with Client(address, timeout="5s") as client:
                client.wait_for_workers(2, timeout=120)
                dirs = client.run(os.getcwd)
                assert len(set(dirs.values())) == 2  # each worker in a folder of its own
            return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def _hold_workers(cluster, signum) -> None:
    """SIGSTOP or SIGCONT to every worker's process group (the `dask worker` and its nanny's child)."""
    for p in cluster["workers"]:
        os.killpg(p.pid, signum)


def _stop(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=15)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)


def _client(cluster, *args, wait=True):
    """`shardkit ARGS` as a client process in a folder of its own (no disk shared with the workers)."""
    cluster["clients"] += 1
    own = _own_folders(cluster["base"], f"client{cluster['clients']}")
    command = [SHARDKIT, *map(str, args)]
    if wait:
        return subprocess.run(command, capture_output=True, text=True, timeout=600, **own)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **own)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    from shardkit.demo.datagen import raw_folder

    root = tmp_path_factory.mktemp("raw") / "raw"
    raw_folder(str(root), images_per_class=10, documents=6, bad=True)
    return root


@pytest.fixture(scope="module")
def local(raw, tmp_path_factory):
    """The reference: the same inputs and options, local folder to local folder, in one process."""
    out = tmp_path_factory.mktemp("local") / "out"
    result = subprocess.run([SHARDKIT, "build", str(raw), str(out), "--workers", "0", *OPTS],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return tree_bytes(out)


def kill_9_mid_build(proc, keys) -> None:
    """kill -9 of the build `proc` once a shard is done (a marker among `keys()`, OUT's keys) and before
    the manifest: it must still be running then, and it leaves no manifest."""
    while proc.poll() is None and not any(k.startswith(".shardkit/done/") for k in keys()):
        time.sleep(0.05)
    assert proc.poll() is None  # mid-build: some shards done, not all
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert "manifest.json" not in keys()


def build_then_kill_9_and_rerun(cluster, store, tmp_path: Path) -> None:
    """On `cluster` (store_cluster's), SRC and OUT on `store` (a test helper with upload, url,
    download and objects: Azure's, GCS's): a build gives the local build's bytes; kill -9 of the
    client mid-build leaves nothing named half-written, and the rerun (taking the lease over) gives
    them too."""
    from shardkit.demo.datagen import raw_folder

    raw = tmp_path / "raw"
    raw_folder(str(raw), images_per_class=10, documents=6, bad=True)
    local = subprocess.run([SHARDKIT, "build", str(raw), str(tmp_path / "local"), "--workers", "0", *OPTS],
                           capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stderr
    src = store.upload(str(raw), "raw")
    first = _client(cluster, "build", src, store.url("out"), "--scheduler", cluster["address"], *OPTS)
    assert first.returncode == 0, first.stderr
    assert tree_bytes(Path(store.download("out", str(tmp_path / "got")))) == tree_bytes(tmp_path / "local")

    args = ["build", src, store.url("k"), "--scheduler", cluster["address"], *OPTS]
    kill_9_mid_build(_client(cluster, *args, wait=False), lambda: store.objects("k"))
    rerun = _client(cluster, *args)
    assert rerun.returncode == 0, rerun.stderr
    assert "took over the lease" in rerun.stderr
    assert tree_bytes(Path(store.download("k", str(tmp_path / "got-k")))) == tree_bytes(tmp_path / "local")


def _downloaded(s3, prefix: str, tmp_path: Path) -> dict:
    return tree_bytes(Path(s3.download(prefix, str(tmp_path / prefix.replace("/", "_")))))


def _markers_name_whole_objects(s3, prefix: str) -> int:
    """Every marker's and the manifest's files are there with their recorded sizes; returns markers seen."""
    keys = set(s3.keys(prefix))
    markers = [k for k in keys if k.startswith(".shardkit/done/")]
    named = [s for m in markers for s in json.loads(s3.fs.cat(f"{BUCKET}/{prefix}/{m}"))["result"]["shards"]]
    if "manifest.json" in keys:
        named += json.loads(s3.fs.cat(f"{BUCKET}/{prefix}/manifest.json")).get("shards", [])
    for info in named:
        for rel, size in [(info["path"], info["bytes"])] + ([(info["index"]["path"], info["index"]["bytes"])]
                                                            if info.get("index") else []):
            assert rel in keys and s3.fs.size(f"{BUCKET}/{prefix}/{rel}") == size, rel
    return len(markers)


def test_s3_to_s3_on_the_cluster_equals_local_and_reruns_write_nothing(cluster, raw, local, tmp_path):
    s3 = cluster["s3"]
    src, out = s3.upload(str(raw), "a/raw"), s3.url("a/out")
    first = _client(cluster, "build", src, out, "--scheduler", cluster["address"], *OPTS)
    assert first.returncode == 0, first.stderr
    assert _downloaded(s3, "a/out", tmp_path) == local
    written = {k: n for k, n in s3.versions("a/out").items() if k.startswith("shards/")}
    again = _client(cluster, "build", src, out, "--scheduler", cluster["address"], *OPTS)
    assert again.returncode == 0 and f"({len(written) // 2} unchanged, reused)" in again.stdout, again.stdout
    assert {k: n for k, n in s3.versions("a/out").items() if k.startswith("shards/")} == written
    with open(raw / "dog" / "000003.jpg", "rb") as f:  # one input changes: another photo's bytes
        s3.fs.pipe(f"{BUCKET}/a/raw/cat/000003.jpg", f.read())
    changed = _client(cluster, "build", src, out, "--scheduler", cluster["address"], *OPTS)
    assert changed.returncode == 0, changed.stderr
    rewritten = {k for k, n in s3.versions("a/out").items() if k.startswith("shards/") and n != written.get(k)}
    assert len(rewritten) == 2 and len({k.split(".")[0] for k in rewritten}) == 1  # one shard and its index
    assert _client(cluster, "verify", out).returncode == 0


def test_kill_9_of_the_client_then_rerun_gives_the_same_bytes(cluster, raw, local, tmp_path):
    s3 = cluster["s3"]
    src, out = s3.upload(str(raw), "k/raw"), s3.url("k/out")
    args = ["build", src, out, "--scheduler", cluster["address"], *OPTS]
    kill_9_mid_build(_client(cluster, *args, wait=False), lambda: s3.keys("k/out"))
    _markers_name_whole_objects(s3, "k/out")
    rerun = _client(cluster, *args)
    assert rerun.returncode == 0, rerun.stderr  # the lease of a process gone from this host is taken over
    assert "took over the lease" in rerun.stderr and "has ended" in rerun.stderr
    assert _downloaded(s3, "k/out", tmp_path) == local
    _markers_name_whole_objects(s3, "k/out")


def test_sigterm_is_one_line_and_exit_143_and_a_second_build_is_refused_naming_the_first(cluster, raw, tmp_path):
    s3 = cluster["s3"]
    src, out = s3.upload(str(raw), "t/raw"), s3.url("t/out")
    args = ["build", src, out, "--scheduler", cluster["address"], *OPTS]
    proc = _client(cluster, *args, wait=False)
    try:
        while proc.poll() is None and "lease" not in s3.keys("t/out/.shardkit"):
            time.sleep(0.05)
        # The workers are held still while the second client starts (seconds on a loaded machine, in
        # which the first build could otherwise end) and while the first is stopped: mid-build, always.
        _hold_workers(cluster, signal.SIGSTOP)
        second = _client(cluster, *args)
        assert second.returncode == 3, second.stderr
        assert f"is being written by `shardkit build` (pid {proc.pid} on host {socket.gethostname()}" in second.stderr
        assert second.stderr.count("\n") == 1
        _hold_workers(cluster, signal.SIGCONT)
        while proc.poll() is None and not any(k.startswith(".shardkit/done/") for k in s3.keys("t/out")):
            time.sleep(0.05)
        _hold_workers(cluster, signal.SIGSTOP)
        assert proc.poll() is None  # mid-build: some shards done, not all
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        _hold_workers(cluster, signal.SIGCONT)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["stopped by SIGTERM: rerun the same command to continue"]
    assert "lease" not in s3.keys("t/out/.shardkit")  # released on the way out
    _markers_name_whole_objects(s3, "t/out")


def test_dedup_s3_to_s3_on_the_cluster_keeps_what_local_dedup_keeps(cluster, raw, tmp_path):
    import shutil

    s3 = cluster["s3"]
    copy = tmp_path / "raw"
    shutil.copytree(raw, copy)
    shutil.copy(copy / "cat" / "000001.jpg", copy / "cat" / "000901.jpg")  # a planted duplicate
    src = s3.upload(str(copy), "d/raw")
    remote = _client(cluster, "dedup", src, s3.url("d/out"), "--scheduler", cluster["address"], "--no-progress")
    assert remote.returncode == 0, remote.stderr
    local = subprocess.run([SHARDKIT, "dedup", str(copy), str(tmp_path / "local"),
                            "--workers", "0", "--no-progress"], capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stderr
    got, want = _downloaded(s3, "d/out", tmp_path), tree_bytes(tmp_path / "local")
    summaries = [json.loads(x.pop("dedup/summary.json")) for x in (got, want)]
    assert got == want and summaries[0]["removed"] == summaries[1]["removed"] >= 1


def test_build_map_on_the_cluster_writes_to_s3_and_reads_back(cluster, tmp_path):
    import map_fns

    from shardkit import StreamingDataset, build_map

    s3 = cluster["s3"]
    remote = build_map(map_fns.make, list(range(50)), s3.url("m/out"), scheduler=cluster["address"],
                       inputs_per_shard=20, progress=False)
    local = build_map(map_fns.make, list(range(50)), str(tmp_path / "local"), workers=0, inputs_per_shard=20,
                      progress=False)
    assert remote.samples == local.samples == 49  # input 37 raises, 5 gives none, 11 gives two
    assert _downloaded(s3, "m/out", tmp_path) == tree_bytes(tmp_path / "local")
    ds = StreamingDataset(s3.url("m/out"), cache_dir=str(tmp_path / "cache"), shuffle=False)
    assert sorted(int(s["cls"]) for s in ds) == sorted([i for i in range(50) if i not in (5, 37)] + [11])
