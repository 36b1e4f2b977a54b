"""No abort at exit: a process that imported torch and read shards with pyarrow's thread pools
running aborted now and then as it exited ("terminate called without an active exception", exit
134). The readers start no native thread, and the commands exit 0 every time, also beside busy
processes (where the race showed)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # torch's own pool stays out of the count

COUNT_THREADS = """
import os, sys
import torch  # noqa: F401 — the abort needs torch imported
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset

def threads():
    return len(os.listdir("/proc/self/task"))

for fmt in ("tar", "parquet"):
    ds = StreamingDataset(sys.argv[1], shuffle=False, format=fmt)
    before = threads()
    ds[0]
    ds.get(ds[len(ds) - 1]["__key__"])  # the key column (page CRCs checked)
    for batch in make_loader(ds, batch_size=8, num_workers=0):
        pass
    print(fmt, before, threads())
"""

STREAM = """
import sys
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset

n = sum(len(b["__key__"]) for b in make_loader(StreamingDataset(sys.argv[1]), batch_size=8, num_workers=0))
assert n == 40, n
"""


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory):
    """Raw uint8 images in tar and Parquet shards (the issue's case: a raw tar dataset)."""
    from shardkit.config import BuildConfig
    from shardkit.demo.datagen import image_folder
    from shardkit.jobs.build import build

    root = tmp_path_factory.mktemp("exit")
    image_folder(str(root / "raw"), n=40, classes=2, size=(48, 40), seed=1)
    build(BuildConfig(src=str(root / "raw"), out=str(root / "ds"), image_size=16, resize_mode="center-crop",
                      encode="raw", format="both", workers=0, progress=False, max_samples_per_shard=16))
    return root / "ds"


def test_reading_shards_starts_no_native_thread(raw_dataset):
    proc = subprocess.run([sys.executable, "-c", COUNT_THREADS, str(raw_dataset)], capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        fmt, before, after = line.split()
        assert before == after, f"reading {fmt} shards started {int(after) - int(before)} thread(s)"


def test_show_and_streaming_exit_0_every_time_beside_busy_processes(raw_dataset):
    """30 x `shardkit show DATASET '#0'` and 30 x streaming in-process, two CPU-bound processes beside."""
    commands = [[str(BIN / "shardkit"), "show", str(raw_dataset), "#0"]] * 30
    commands += [[sys.executable, "-c", STREAM, str(raw_dataset)]] * 30
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]

    def run(cmd):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
        return proc.returncode, proc.stderr[-500:]

    try:
        with ThreadPoolExecutor(4) as pool:  # in parallel batches: the runs are mostly torch's import
            results = list(pool.map(run, commands))
    finally:
        for p in busy:
            p.kill()
            p.wait()
    failed = [(cmd[1], rc, err) for cmd, (rc, err) in zip(commands, results) if rc != 0]
    assert not failed, failed
