"""Remote faults told apart, over the throttled store on 127.0.0.1 (tests/throttled.py): a body cut
short is a fault that may pass, retried; a full cache disk is this machine's, named with its fix;
a fetch that failed fails the other workers waiting on it at once, within the documented bound."""

import errno
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from factory import keys_of, make_dataset, read_epoch, same_batches
from throttled import Store

from shardkit.errors import ShardError
from shardkit.store.remote import DiskError, RemoteError, RemotePolicy, ShortBody, retryable, with_retries
from shardkit.reader.dataset import StreamingDataset

SHARD = "/shards/data-00001.tar"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """36 samples of 12x16 raw images in 4 tar shards (~15 KB each: one GET per shard)."""
    return make_dataset(tmp_path_factory.mktemp("faults"), 36, shards=4, fields=("raw", "cls", "txt"))


@pytest.fixture
def store(data):
    with Store.instant(data[0]) as s:
        yield s


epoch = read_epoch
same = same_batches


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "no-content-length"])
def test_a_body_cut_once_is_retried_and_the_epoch_completes(data, store, tmp_path, length):
    root, _ = data
    store.cut(SHARD, times=1, length=length)
    _, local = epoch(root, tmp_path / "unused")
    _, remote = epoch(store.url, tmp_path / "cache")
    same(local, remote)
    assert store.gets[SHARD] == 2  # the cut try, then the whole one


def test_a_part_cut_once_is_retried_alone(data, store, tmp_path, monkeypatch):
    from shardkit.reader import download

    monkeypatch.setattr(download, "PART", 4096)  # ~15 KB shards: 4 ranged GETs each
    root, _ = data
    store.cut(SHARD, times=1)  # its first part (the probe of Range)
    _, local = epoch(root, tmp_path / "unused")
    _, remote = epoch(store.url, tmp_path / "cache", connections=2)
    same(local, remote)
    parts = -(-os.path.getsize(os.path.join(root, SHARD[1:])) // 4096)
    # one part twice, the others once; on a loaded machine a batch may also read rows of this shard by
    # range while its parts come (one GET more: seen once in a run under stress --cpu 2), never all again
    assert parts + 1 <= store.gets[SHARD] <= parts + 2


def test_a_row_read_by_range_cut_once_is_retried(data, store, tmp_path):
    root, _ = data
    store.cut(SHARD, times=1)
    expected = StreamingDataset(root, shuffle=False)[12]  # a sample of shard 1
    ds = StreamingDataset(store.url, cache_dir=str(tmp_path / "cache"))
    got = ds[12]
    assert got["__key__"] == expected["__key__"] and torch.equal(got["raw"], expected["raw"])
    assert store.range_gets[SHARD] == 2


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("length", [True, False], ids=["content-length", "no-content-length"])
def test_a_body_cut_every_time_fails_naming_the_url_within_the_bound(data, tmp_path, workers, length):
    """The documented bound is one fetch's tries: with two workers sharing the cache, the one waiting
    on the failed fetch fails at once with its error instead of trying again itself (that doubled the
    time to the error). Never called a corrupt copy, nor an HTTP 400 the store never sent."""
    root, _ = data
    store = Store(root, latency=0.2, rate=None)  # the tries outlast the workers' start by far
    store.cut(SHARD, times=float("inf"), length=length)
    try:
        with pytest.raises(ShardError, match=rf"cannot fetch shard {store.url}{SHARD}: the body broke off before its "
                                             r"end .*\(tried 2 time\(s\)") as caught:
            # In order: both workers read shard 1 in their first two batches (batch size 5, ~9 samples a shard).
            epoch(store.url, tmp_path / "cache", workers=workers, retries=1, shuffle=False)
        assert "corrupt" not in str(caught.value) and not re.search(r"\b400\b", str(caught.value))
        assert store.gets[SHARD] == 2  # retries + 1, whatever the workers
    finally:
        store.close()


def test_a_rerun_after_a_failed_fetch_tries_again(data, store, tmp_path):
    root, expected = data
    store.cut(SHARD, times=2)
    with pytest.raises(ShardError, match="broke off"):
        epoch(store.url, tmp_path / "cache", retries=1)
    _, got = epoch(store.url, tmp_path / "cache", retries=1)  # a new epoch: the failure is not replayed
    assert sorted(keys_of(got)) == sorted(expected)


class FullDisk:
    """os.pwrite as on a disk that fills up: the first write stops halfway, the next fails ENOSPC."""

    def __init__(self):
        self.real, self.calls = os.pwrite, 0

    def __call__(self, fd, data, offset):
        self.calls += 1
        if self.calls == 1:
            return self.real(fd, memoryview(data)[: max(1, len(data) // 2)], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_cache_disk_names_the_disk_and_the_fix(data, store, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "pwrite", FullDisk())
    cache = tmp_path / "cache"
    with pytest.raises(DiskError, match=rf"^No space left on device: free space in {cache} or lower cache_limit") as e:
        epoch(store.url, cache, fetch_ahead=0)  # one fetch at a time: the first write fails
    assert "rebuild" not in str(e.value) and "corrupt" not in str(e.value) and "store" not in str(e.value)
    assert sum(store.gets.values()) == 2  # the manifest and one file: a full disk is not retried
    assert not [f for f in cache.rglob("*") if ".tmp-" in f.name]  # the part-written file is gone


SMALL_DISK = """
import sys
from shardkit import StreamingDataset, make_loader
from shardkit.store.remote import DiskError
try:
    ds = StreamingDataset(sys.argv[1], cache_dir=sys.argv[2], seed=7)
    list(make_loader(ds, batch_size=5, num_workers=int(sys.argv[3])))
except DiskError as e:
    print("DiskError:", e)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cache_dir_on_a_small_tmpfs_names_the_disk_and_the_fix(tmp_path, workers):
    """The real thing where this machine allows it: a 64 KiB tmpfs (a mount namespace of our own)."""
    root, _ = make_dataset(tmp_path / "data", 96, shards=8, fields=("raw", "cls", "txt"), size=(32, 32))
    unshare = shutil.which("unshare")
    cache = tmp_path / "cache"
    cache.mkdir()
    probe = subprocess.run([unshare or "unshare", "-rm", "true"], capture_output=True) if unshare else None
    if probe is None or probe.returncode:
        pytest.skip("no mount namespace here for a tmpfs; test_a_full_cache_disk_names_the_disk_and_the_fix fakes it")
    store = Store.instant(root)
    try:
        script = f"mount -t tmpfs -o size=64k tmpfs {cache} && exec {sys.executable} -c '{SMALL_DISK}' {store.url} {cache} {workers}"
        out = subprocess.run([unshare, "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    finally:
        store.close()
    assert f"DiskError: No space left on device: free space in {cache} or lower cache_limit" in out.stdout, out.stderr


def test_the_classifier_tells_faults_that_may_pass_from_answers():
    import aiohttp
    from aiohttp.http_exceptions import ContentLengthError

    url = "http://127.0.0.1:9/x"
    cut = aiohttp.ClientPayloadError("Response payload is not completed")
    cut.__cause__ = ContentLengthError("Not enough data to satisfy content length header.")  # its code is 400
    assert retryable(cut, url) and retryable(ShortBody("cut"), url) and retryable(TimeoutError(), url)
    assert not retryable(FileNotFoundError(url), url)
    tries = []

    def attempt():
        tries.append(1)
        raise cut

    with pytest.raises(RemoteError, match=r"the body broke off before its end .*tried 3 time\(s\)"):
        with_retries(url, RemotePolicy(retries=2, backoff=0.001), attempt)
    assert len(tries) == 3


@pytest.mark.parametrize("status, said", [(503, "HTTP 503 Service Unavailable"), (599, "HTTP 599")])
def test_an_answer_is_named_by_its_status_even_one_the_standard_library_does_not_name(status, said):
    class Answer(Exception):
        pass

    answer = Answer("store said no")
    answer.status = status

    def attempt():
        raise answer

    with pytest.raises(RemoteError) as e:
        with_retries("http://127.0.0.1:9/x", RemotePolicy(retries=0), attempt)
    assert said in str(e.value)


def test_the_error_names_the_fix_its_policy_carries():
    """A job's policy names its flags, the reader's its keywords: the text travels with the policy."""
    from shardkit.store.remote import JOB_FIX

    def attempt():
        raise TimeoutError("no answer")

    for policy, fix in [(RemotePolicy(retries=0), "StreamingDataset(timeout=..., retries=...) allow"),
                        (RemotePolicy(retries=0, fix=JOB_FIX), "shardkit build --timeout/--retries allow")]:
        with pytest.raises(RemoteError) as e:
            with_retries("http://127.0.0.1:9/x", policy, attempt)
        assert fix in str(e.value)


def test_a_temp_file_the_disk_refuses_to_size_is_removed(data, store, tmp_path, monkeypatch):
    """The temp file is made at its full size at once (sparse): a disk that refuses that size (a full
    one, a quota, a file size limit) failed the fetch with the temp file left behind (its descriptor open)."""
    real, fds = os.ftruncate, []

    def refuse(fd, length):
        fds.append(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "ftruncate", refuse)
    cache = tmp_path / "cache"
    with pytest.raises(DiskError, match=r"^No space left on device: free space in"):
        epoch(store.url, cache, fetch_ahead=0)
    monkeypatch.setattr(os, "ftruncate", real)
    assert fds and not [f for f in cache.rglob("*") if ".tmp-" in f.name]


CUT_SHORT = """
import multiprocessing, sys, threading, time
from shardkit.reader.download import download

def child(url, dest):
    threading.Thread(target=download, args=(url, dest, "0" * 64, None), daemon=True).start()
    time.sleep(1.5)  # the body comes a byte a second: mid-transfer now; the process ends as a worker does

p = multiprocessing.get_context("fork").Process(target=child, args=sys.argv[1:3])
p.start()
p.join()
"""


def test_a_process_that_ends_mid_fetch_leaves_no_temp_file(data, tmp_path):
    """A DataLoader worker leaves by os._exit when the loader shuts down (after another worker's
    error, a full disk say): its fetch threads stop mid-body, and their temp files stayed."""
    root, _ = data
    store = Store.instant(root)
    store.trickle("/shards/")
    try:
        subprocess.run([sys.executable, "-c", CUT_SHORT, store.url + SHARD, str(tmp_path / "x.tar")], timeout=120,
                       check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    finally:
        store.close()
    assert store.gets[SHARD] == 1 and os.listdir(tmp_path) == []
