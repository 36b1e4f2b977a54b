"""A build killed with SIGKILL leaves no lying manifest; a real `dask scheduler` + workers build equals the embedded one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardkit.store.local import sha256_file

from conftest import tree_bytes

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def _shardkit(*args) -> list[str]:
    return [str(BIN / "shardkit"), *map(str, args)]


def _markers(out: Path) -> list[dict]:
    done = out / ".shardkit" / "done"
    return [json.loads(p.read_text()) for p in sorted(done.glob("shard-*.json"))] if done.exists() else []


def _manifest_is_honest(out: Path) -> None:
    """If a manifest exists, every file it names exists whole, with the recorded checksum."""
    path = out / "manifest.json"
    if not path.exists():
        return
    for shard in json.loads(path.read_text())["shards"]:
        assert sha256_file(out / shard["path"]) == shard["sha256"]


@pytest.fixture
def big_raw(tmp_path):
    from shardkit.demo.datagen import image_folder

    root = tmp_path / "raw"
    image_folder(str(root), n=80, classes=4, size=(320, 240), seed=3)
    return root


def test_sigkill_mid_build_then_rerun_redoes_only_unfinished(big_raw, tmp_path):
    out = tmp_path / "out"
    args = _shardkit("build", big_raw, out, "--workers", "0", "--max-samples-per-shard", "2",
                     "--image-size", "200", "--encode", "png", "--no-progress")
    # A complete earlier build with other options: its manifest must not survive into the killed one.
    subprocess.run(_shardkit("build", big_raw, out, "--workers", "0", "--max-samples-per-shard", "2",
                             "--no-progress"), check=True, capture_output=True)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    # Kill once some, but not all, of the new build's 40 shards are done.
    while _count_png_shards(out) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    _manifest_is_honest(out)
    done_before = _count_png_shards(out)
    assert 3 <= done_before < 40
    rerun = subprocess.run(args, check=True, capture_output=True, text=True)
    assert f"({done_before} unchanged, reused)" in rerun.stdout
    _manifest_is_honest(out)
    assert subprocess.run(_shardkit("verify", out), capture_output=True).returncode == 0


def _count_png_shards(out: Path) -> int:
    """Shards the PNG build finished: a marker whose checksum matches a tar holding .png members.

    A marker of the earlier JPEG build may still sit beside a PNG shard the killed build wrote
    but never marked; its checksum no longer matches, and the rerun must not reuse it.
    """
    n = 0
    for m in _markers(out):
        shards = m["result"]["shards"]
        path = out / shards[0]["path"] if shards else None
        if path and _tar_has_png(path) and sha256_file(path) == shards[0]["sha256"]:
            n += 1
    return n


def _tar_has_png(path: Path) -> bool:
    try:
        return b".png\0" in path.read_bytes()[:4096]
    except FileNotFoundError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_scheduler_and_workers_give_the_same_bytes(raw_folder, tmp_path):
    """Images, jsonl and Parquet rows (with bad rows) built by `dask scheduler` + `dask worker`."""
    from test_build_scale import hf_image_parquet

    def embedded_settings() -> dict:  # defined here: pickled by value (workers cannot import tests)
        """The values of EMBEDDED_CLUSTER_CONFIG's settings in this Dask process, normalised."""
        import dask

        from shardkit.jobs.cluster import EMBEDDED_CLUSTER_CONFIG

        out = {}
        for key in EMBEDDED_CLUSTER_CONFIG:
            if key == "distributed.worker.multiprocessing-method" or "pre-spawn-environ" in key:
                continue
            value = dask.config.get(key)
            out[key] = value if not isinstance(value, (int, float)) or isinstance(value, bool) else f"{value}s"
        return out

    hf_image_parquet(raw_folder / "cat" / "extra.parquet", n=10, row_group_size=3, text_column="text")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    # The scheduler and workers read the docker image's Dask configuration, as in docker/compose.yml.
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    env["DASK_CONFIG"] = str(ROOT / "docker" / "dask")
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env=env)]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen([str(BIN / "dask"), "worker", address, "--nthreads", "1",
                                           "--nworkers", "1", "--no-dashboard", "--host", "127.0.0.1"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True, env=env))
        from distributed import Client

        deadline = time.time() + 60
        while True:
            try:
                with Client(address, timeout="5s") as client:
                    client.wait_for_workers(2, timeout=60)
                    trim = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
                    worker_config = client.run(embedded_settings)
                    scheduler_config = client.run_on_scheduler(embedded_settings)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        assert list(trim.values()) == [None, None]  # docker/dask/shardkit.yaml took effect
        # ... with every setting of the embedded cluster that workers or the scheduler read
        from shardkit.jobs.cluster import EMBEDDED_CLUSTER_CONFIG

        expected = {k: v for k, v in EMBEDDED_CLUSTER_CONFIG.items()
                    if k != "distributed.worker.multiprocessing-method" and "pre-spawn-environ" not in k}
        assert all(c == expected for c in worker_config.values()) and scheduler_config == expected, worker_config
        opts = ["--image-size", "40", "--format", "both", "--max-samples-per-shard", "9", "--no-progress"]
        remote = subprocess.run(_shardkit("build", raw_folder, tmp_path / "remote", "--scheduler", address, *opts),
                                capture_output=True, text=True, timeout=300)
        assert remote.returncode == 0, remote.stderr
        local = subprocess.run(_shardkit("build", raw_folder, tmp_path / "local", "--workers", "2", *opts),
                               capture_output=True, text=True, timeout=300)
        assert local.returncode == 0, local.stderr
        a, b = tree_bytes(tmp_path / "remote"), tree_bytes(tmp_path / "local")
        assert len(a) > 5 and a == b
        assert any(b"cat/extra/000009.jpg" in data for name, data in a.items() if name.endswith(".tar"))
        assert b"cat/extra.parquet:5" in a["errors.jsonl"]  # the undecodable image row
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def test_embedded_cluster_workers_keep_glibc_adaptive_malloc(monkeypatch):
    """The nanny's default MALLOC_TRIM_THRESHOLD_ made every image ~25% slower in the workers."""
    from shardkit.jobs.cluster import dask_client

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with dask_client(None, 2) as client:
        trim = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
        omp = client.run(lambda: os.environ.get("OMP_NUM_THREADS"))
    assert list(trim.values()) == [None, None]
    assert list(omp.values()) == ["1", "1"]  # the nanny's other settings still apply
