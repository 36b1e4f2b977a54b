"""A store that trickles (a byte a second: every read of the socket returns within any timeout) fails
as a stall, for the loader and for `shardkit show`: the whole body has a deadline (http_ranges.FLOOR_RATE),
not only the wait between two reads. Each read runs in a subprocess, so that a hang fails the test."""

import os
import subprocess
import sys

import pytest
from factory import make_dataset
from throttled import Store

HANG = 120  # seconds: far above the bound (2 tries of a 2 s timeout); only a hang reaches it


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("trickle"), 12, shards=2, fields=("raw", "cls", "txt"))


@pytest.fixture
def store(data):
    with Store.instant(data[0]) as s:
        s.trickle("/shards/")  # manifest.json comes at once, every shard file a byte a second
        yield s


def _run(args, **kw):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(args, capture_output=True, text=True, timeout=HANG, env=env, **kw)


LOADER = """
import sys
from shardkit import StreamingDataset, make_loader
from shardkit.errors import ShardError
ds = StreamingDataset(sys.argv[1], cache_dir=sys.argv[2], timeout=2, retries=1)
try:
    list(make_loader(ds, batch_size=4, num_workers=int(sys.argv[3])))
except ShardError as e:
    print("ShardError:", e)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_trickling_store_fails_the_loader_as_a_stall(store, tmp_path, workers):
    out = _run([sys.executable, "-c", LOADER, store.url, str(tmp_path / "cache"), str(workers)])
    assert "ShardError: cannot fetch shard" in out.stdout, out.stdout + out.stderr
    assert "below the floor of 64 KiB/s, for longer than the 2 s timeout" in out.stdout
    assert "tried 2 time(s)" in out.stdout  # a stall is retried as one
    assert not [f for f in (tmp_path / "cache").rglob("*") if ".tmp-" in f.name]


# `shardkit show` has no --timeout: its dataset's defaults (15 s, 2 retries: a stall within ~48 s)
# shortened for the test.
SHOW = """
import functools, sys
import shardkit.reader.dataset as d
d.StreamingDataset = functools.partial(d.StreamingDataset, timeout=2, retries=1)
from shardkit.cli import main
sys.argv[0] = "shardkit"
main()
"""


def test_a_trickling_store_fails_show_in_one_line(data, store, tmp_path):
    key = sorted(data[1])[0]
    out = _run([sys.executable, "-c", SHOW, "show", store.url, key, "--cache-dir", str(tmp_path / "cache")])
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and "below the floor of 64 KiB/s" in out.stderr, out.stderr
