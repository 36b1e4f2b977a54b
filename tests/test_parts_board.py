"""A large file's parts shared between processes (reader.parts_board): another process that wants a
file being downloaded takes the parts its connections have room for; the file is the same bytes
whoever fetched them, and a helper that fails or is killed mid-part leaves its part to the owner."""

import fcntl
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


def _own(url, dest, sha, done, policy):
    """The owner: download with one connection, in a process of its own; done=1 when it ended whole."""
    with ThreadPoolExecutor(1) as pool:
        dl.download(url, dest, sha, SIZE, policy, pool=pool, ranges=True)
    done.value = 1


def _start_owner(store, dest, sha, policy=RemotePolicy(timeout=5, retries=2)):
    ctx = multiprocessing.get_context("fork")
    done = ctx.Value("i", 0)
    owner = ctx.Process(target=_own, args=(f"{store.url}/big.bin", dest, sha, done, policy))
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


def test_a_helper_whose_gets_fail_leaves_its_parts_to_the_owner(blob, monkeypatch):
    store, data, sha, cache = blob
    store.latency = 0.25  # the owner alone takes > 5 s: under load the helper still comes while parts are left
    cache.mkdir()
    dest = str(cache / "big.bin")
    owner, done = _start_owner(store, dest, sha)
    tries, real = [], dl.read_range
    monkeypatch.setattr(dl, "read_range", lambda url, *a, **k: tries.append(url) or real(url, *a, **k))  # here only
    with ThreadPoolExecutor(4) as pool:  # every GET of the helper answers 404
        helped = dl.help_with(dest, f"{store.url}/missing.bin", SIZE, RemotePolicy(timeout=5, retries=0), pool)
    # It stopped at its first failures: a part it gave back is not its own next take (at most one
    # try per connection), so the owner is not kept waiting on parts the helper keeps failing.
    assert 1 <= len(tries) <= 4
    owner.join(60)
    assert helped == 0 and done.value == 1 and open(dest, "rb").read() == data


def _hold_a_part(dest, held, parts=1):
    board, fd = parts_board.join(dest, SIZE, PART)
    for _ in range(parts):
        held.value = board.take()
    time.sleep(60)  # killed here, its parts' locks held


def _seen_alive_from_another_process(board: str) -> bool:
    """Whether another process finds the board's owner alive (its lock on byte 0 held)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(board, os.O_RDWR)
            try:
                fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 0)
            except OSError:
                code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


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


def test_a_helper_stuck_on_a_part_holds_the_owner_no_longer_than_a_parts_tries(blob):
    """A helper stopped (or stuck) with a part taken: past the time a part's GET may take with every
    try (reader.download._patience), the owner fetches that part itself."""
    store, data, sha, cache = blob
    cache.mkdir()
    dest = str(cache / "big.bin")
    policy = RemotePolicy(timeout=1, retries=0)  # patience: 1 + 64 KiB at 64 KiB/s + 1 = 3 s
    owner, done = _start_owner(store, dest, sha, policy)
    ctx = multiprocessing.get_context("fork")
    held = ctx.Value("i", -1)
    helper = ctx.Process(target=_hold_a_part, args=(dest, held, 4))  # 4 parts: one patience for all
    helper.start()
    try:
        owner.join(9)  # ~1 s alone, + 3 s of patience once (four times: ~13 s)
        assert done.value == 1 and open(dest, "rb").read() == data and helper.is_alive()
    finally:
        os.kill(helper.pid, signal.SIGKILL)
        helper.join()


def test_a_helper_stops_when_the_owner_is_gone(blob):
    store, data, sha, cache = blob
    cache.mkdir()
    dest = str(cache / "big.bin")
    owner, done = _start_owner(store, dest, sha)
    os.kill(owner.pid, signal.SIGKILL)  # its board and temp file stay behind until the next owner
    owner.join()
    before = store.gets["/big.bin"]
    with ThreadPoolExecutor(4) as pool:
        assert dl.help_with(dest, f"{store.url}/big.bin", SIZE, RemotePolicy(timeout=5, retries=0), pool) == 0
    assert store.gets["/big.bin"] == before  # nothing fetched into a temp file that no one will rename
    assert not done.value and not os.path.exists(dest)


def test_one_process_never_helps_with_its_own_download(blob, monkeypatch):
    """Two caches of one root in one process (a mixture naming a dataset twice): the second, finding
    the file claimed, would share the process's record locks with the first, and fetch every part
    again."""
    import threading

    from shardkit.reader import cache as cache_module
    from shardkit.reader.cache import ShardCache

    store, data, sha, cache = blob
    policy = RemotePolicy(timeout=5, retries=1)
    with ThreadPoolExecutor(1) as one, ThreadPoolExecutor(4) as two:
        first = ShardCache(store.url, cache_dir=str(cache), policy=policy, pool=one)  # ~1 s on one connection
        second = ShardCache(store.url, cache_dir=str(cache) + "/.", policy=policy, pool=two)  # the folder spelled apart
        first.ranges = second.ranges = True
        got = {}
        owner = threading.Thread(target=lambda: got.update(first=first.pin("big.bin", sha, SIZE)))
        monkeypatch.setattr(cache_module, "PART", PART)
        owner.start()
        deadline = time.monotonic() + 10
        while not (boards := list(cache.rglob("*.tmp-parts"))):
            assert time.monotonic() < deadline, "the owner never posted a board"
            time.sleep(0.002)
        assert second.pin("big.bin", sha, SIZE, wait=False) is None
        # The second cache neither took parts nor opened the board: closing a descriptor of it here
        # would have dropped the owner's locks, and other processes would take the owner for dead.
        assert _seen_alive_from_another_process(str(boards[0]))
        owner.join(20)
    assert open(got["first"][0], "rb").read() == data
    assert store.range_gets["/big.bin"] == -(-SIZE // PART)  # each part once


def test_a_helper_that_meets_a_store_ignoring_range_tells_its_cache(blob, monkeypatch, tmp_path):
    from shardkit.reader import cache as cache_module
    from shardkit.store.remote import RangeIgnored

    store, data, sha, cache = blob

    def refused(*args):
        raise RangeIgnored("asked bytes 0-65535, the store sends the whole file")

    monkeypatch.setattr(cache_module, "help_with", refused)
    monkeypatch.setattr(cache_module, "PART", PART)
    with ThreadPoolExecutor(1) as pool:
        c = cache_module.ShardCache(store.url, cache_dir=str(cache), pool=pool)
        assert c._help("big.bin", str(tmp_path / "big.bin"), SIZE) is None and c.ranges is False


def test_a_forked_child_does_not_remove_its_parents_downloads_at_its_exit(blob):
    """A DataLoader worker forked while its parent downloads: the parent's temp file and board are
    not the child's to remove when it leaves."""
    import threading

    store, data, sha, cache = blob
    cache.mkdir()
    dest = str(cache / "big.bin")
    got = {}

    def own():
        with ThreadPoolExecutor(1) as pool:
            got["ok"] = dl.download(f"{store.url}/big.bin", dest, sha, SIZE, RemotePolicy(), pool=pool, ranges=True)

    owner = threading.Thread(target=own)
    owner.start()
    while not os.path.exists(parts_board.board_path(dest)):
        time.sleep(0.002)
    pid = os.fork()
    if pid == 0:
        os._exit(0 if not dl._ACTIVE else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    owner.join(20)
    assert open(dest, "rb").read() == data
