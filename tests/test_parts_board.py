"""A large file's parts shared between processes (reader.parts_board): another process that wants a
file being downloaded takes the parts its connections have room for; the file is the same bytes
whoever fetched them, and a helper that fails or is killed mid-part leaves its part to the owner."""

import hashlib
import multiprocessing
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from throttled import Store

from shardkit.reader import download as dl
from shardkit.reader import parts_board
from shardkit.store.remote import RemotePolicy

PART = 64 << 10
SIZE = 20 * PART + 12345  # 21 parts, the last one short


@pytest.fixture
def blob(tmp_path, monkeypatch):
    monkeypatch.setattr(dl, "PART", PART)
    (tmp_path / "store").mkdir()
    data = os.urandom(SIZE)
    (tmp_path / "store" / "big.bin").write_bytes(data)
    # Each GET waits 50 ms: an owner with one connection takes > 1 s alone, so the helper finds parts to take.
    store = Store(tmp_path / "store", latency=0.05, rate=None)
    yield store, data, hashlib.sha256(data).hexdigest(), tmp_path / "cache"
    store.close()


def _own(url, dest, sha, done):
    """The owner: download with one connection, in a process of its own; done=1 when it ended whole."""
    with ThreadPoolExecutor(1) as pool:
        dl.download(url, dest, sha, SIZE, RemotePolicy(timeout=5, retries=2), pool=pool, ranges=True)
    done.value = 1


def _start_owner(store, dest, sha):
    ctx = multiprocessing.get_context("fork")
    done = ctx.Value("i", 0)
    owner = ctx.Process(target=_own, args=(f"{store.url}/big.bin", dest, sha, done))
    owner.start()
    deadline = time.monotonic() + 10
    while not os.path.exists(parts_board.board_path(dest)):  # the owner posted its parts
        assert time.monotonic() < deadline and owner.is_alive(), "the owner never posted a board"
        time.sleep(0.005)
    return owner, done


def test_a_second_process_takes_parts_of_a_download_and_the_file_is_whole(blob):
    store, data, sha, cache = blob
    cache.mkdir()
    dest = str(cache / "big.bin")
    owner, done = _start_owner(store, dest, sha)
    with ThreadPoolExecutor(4) as pool:
        helped = dl.help_with(dest, f"{store.url}/big.bin", SIZE, RemotePolicy(timeout=5, retries=2), pool)
    owner.join(20)
    assert done.value == 1 and open(dest, "rb").read() == data
    # The helper's 4 connections took most of the 21 parts while the owner's one fetched a few.
    assert PART * 8 <= helped < SIZE
    assert sorted(os.listdir(cache)) == ["big.bin"]  # no temp file, no board left


def test_a_helper_whose_gets_fail_leaves_its_parts_to_the_owner(blob):
    store, data, sha, cache = blob
    cache.mkdir()
    dest = str(cache / "big.bin")
    owner, done = _start_owner(store, dest, sha)
    with ThreadPoolExecutor(4) as pool:  # every GET of the helper answers 404
        helped = dl.help_with(dest, f"{store.url}/missing.bin", SIZE, RemotePolicy(timeout=5, retries=0), pool)
    owner.join(30)
    assert helped == 0 and done.value == 1 and open(dest, "rb").read() == data


def _hold_a_part(dest, held):
    board, fd = parts_board.join(dest, SIZE, PART)
    i = board.take()
    held.value = i
    time.sleep(60)  # killed here, its part's lock held


def test_a_helper_killed_mid_part_leaves_it_to_the_owner(blob):
    store, data, sha, cache = blob
    cache.mkdir()
    dest = str(cache / "big.bin")
    owner, done = _start_owner(store, dest, sha)
    ctx = multiprocessing.get_context("fork")
    held = ctx.Value("i", -1)
    helper = ctx.Process(target=_hold_a_part, args=(dest, held))
    helper.start()
    while held.value < 0:
        time.sleep(0.005)
    owner.join(3)  # the owner's own parts end in ~1 s; it then waits on the part the helper holds
    assert owner.is_alive() and done.value == 0
    os.kill(helper.pid, signal.SIGKILL)
    helper.join()
    owner.join(20)
    assert done.value == 1 and open(dest, "rb").read() == data


def test_no_board_of_other_parts_is_joined(blob, tmp_path):
    store, data, sha, cache = blob
    cache.mkdir()
    dest = str(cache / "big.bin")
    owner, done = _start_owner(store, dest, sha)
    try:
        assert parts_board.join(dest, SIZE + 1, PART) is None  # another size: another file
        assert parts_board.join(dest, SIZE, PART * 2) is None  # other parts: its bytes would not line up
        assert parts_board.join(str(cache / "other.bin"), SIZE, PART) is None  # nothing being fetched
    finally:
        owner.join(20)
    assert done.value == 1 and open(dest, "rb").read() == data
