"""An error in a DataLoader worker reaches the training loop as shardkit raised it: its one line,
its class, not torch's RuntimeError around the worker's traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardkit.errors import ChecksumMismatch, ShardError, from_worker
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset

from factory import make_dataset
from test_checksums import KEY, flip_tar_member

ROOT = Path(__file__).resolve().parent.parent


def _iterate(root, workers: int = 1):
    ds = StreamingDataset(root, shuffle=False)
    for _ in make_loader(ds, batch_size=8, num_workers=workers):
        pass


def test_a_checksum_mismatch_in_a_worker_keeps_its_class_and_line(tmp_path):
    root, _ = make_dataset(tmp_path / "d", 40, fields=("raw", "cls"))
    flip_tar_member(root, KEY, "raw")
    with pytest.raises(ChecksumMismatch) as caught:  # torch alone raised a RuntimeError here
        _iterate(root)
    message = str(caught.value)
    assert "\n" not in message and KEY in message and "DataLoader worker" not in message
    assert "Traceback" in caught.value.worker_traceback
    assert any("worker process 0" in note for note in caught.value.__notes__)


def test_a_missing_shard_in_a_worker_is_one_line(tmp_path):
    root, _ = make_dataset(tmp_path / "d", 40)
    os.remove(os.path.join(root, "shards", "data-00002.tar"))
    with pytest.raises(ShardError) as caught:
        _iterate(root)
    assert str(caught.value).startswith("shard ") and "\n" not in str(caught.value)


def test_the_screen_shows_shardkit_line_not_the_worker_wall(tmp_path):
    """What a user's script prints: the last line is shardkit's message; the worker's traceback is not shown."""
    root, _ = make_dataset(tmp_path / "d", 40, fields=("raw", "cls"))
    flip_tar_member(root, KEY, "raw")
    script = ("import sys\nfrom shardkit.loader import make_loader\nfrom shardkit.reader.dataset import StreamingDataset\n"
              "for b in make_loader(StreamingDataset(sys.argv[1], shuffle=False), batch_size=8, num_workers=1):\n"
              "    pass\n")
    proc = subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-2].startswith("shardkit.errors.ChecksumMismatch: ") and KEY in lines[-2]
    assert "Caught" not in proc.stderr and "Original Traceback" not in proc.stderr


def test_other_errors_are_left_as_they_are():
    assert from_worker(RuntimeError("Caught ValueError in DataLoader worker process 0.\nOriginal Traceback "
                                    "(most recent call last):\nValueError: x")) is None
    assert from_worker(ValueError("plain")) is None
