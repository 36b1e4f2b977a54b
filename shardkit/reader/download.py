"""One remote file into the shard cache: a temp file beside its final name, filled by one GET or by
parallel ranged GETs written in place, then renamed. What is wrong is named by who can fix it: a
body cut short is retried (store.remote.read_range), a full disk is this machine's (store.remote.DiskError), and a
remote copy is called corrupt only when a whole body of the right size fails its sha256."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, wait

from shardkit.errors import ShardError
from shardkit.store.http_ranges import FLOOR_RATE, Stalled
from shardkit.store.remote import (DiskError, RangeIgnored, RemoteError, RemotePolicy, ShortBody, filesystem,
                                   read_bytes, read_range, refused_at_headers, with_retries)
from shardkit.store.local import sha256_file, tmp_name
from shardkit.reader import parts_board

log = logging.getLogger(__name__)

CHUNK = 1 << 20
# Bytes per ranged GET of a large file. At 25 MB/s per connection and 50 ms to the first byte a
# 4 MiB part spends 77% of its time transferring (8 MiB: 87%), and each part in flight holds its
# bytes in memory: connections x PART per process (32 MiB at 8 connections).
PART = 4 << 20
PROBE = 64 << 10  # the range that finds out whether a store honours Range


_local = threading.local()


def _buffer(nbytes: int) -> memoryview:
    """This thread's buffer for a part (reused: a part is read into it, then written in place)."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _local.buf = bytearray(max(nbytes, PART))
    return memoryview(buf)[:nbytes]


_ACTIVE: set[str] = set()  # temp files of this process's downloads in progress
_EXIT_HOOK = {"pid": None}


def _at_exit() -> None:
    """A process that ends with downloads in progress (a DataLoader worker leaves by os._exit once the
    loader is shut down, its fetch threads cut mid-body) removes their temp files."""
    for path in list(_ACTIVE):
        with contextlib.suppress(OSError):
            os.remove(path)


def _forget_active() -> None:
    """A forked child's exit must not remove its parent's downloads in progress."""
    _ACTIVE.clear()


os.register_at_fork(after_in_child=_forget_active)


def _track(path: str) -> None:
    if _EXIT_HOOK["pid"] != os.getpid():  # a forked child starts without its parent's finalizers
        import multiprocessing.util

        multiprocessing.util.Finalize(None, _at_exit, exitpriority=10)  # run at exit, in children too
        _EXIT_HOOK["pid"] = os.getpid()
    _ACTIVE.add(path)


class Into:
    """Where a download writes: the temp file's descriptor, and what a failed write names (the
    cache folder, the URL)."""

    def __init__(self, path: str, folder: str, url: str, nbytes: int | None = None):
        self.path, self.folder, self.url = path, folder, url
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise DiskError(e, folder, url) from e
        _track(path)
        try:
            if nbytes:  # full size at once (sparse): the cache's listing counts it while it fills
                os.ftruncate(self.fd, nbytes)
        except OSError as e:  # a disk that refuses the size: the temp file made just now goes too
            _discard(self)
            raise DiskError(e, folder, url) from e

    def write(self, data, offset: int) -> None:
        try:
            _pwrite_all(self.fd, data, offset)
        except OSError as e:
            raise DiskError(e, self.folder, self.url) from e

    def close(self) -> None:
        os.close(self.fd)


def _pwrite_all(fd: int, data, offset: int) -> None:
    """All of `data` at `offset`: pwrite may write less than asked (a disk filling up), and a short
    write ignored would leave a hole of zeros in the file."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[n:], offset + n


def _stream(url: str, into: Into, nbytes: int | None, policy: RemotePolicy, pool) -> None:
    """The whole file in one streamed GET with retries (a store that ignores Range, or a size the
    manifest does not give); on the pool when there is one, so that it holds a connection."""
    fs, path = filesystem(url, policy)
    # http(s): one streamed GET; its size comes from the manifest, not from a HEAD request.
    options = {"block_size": 0, "size": nbytes} if path.startswith(("http://", "https://")) and nbytes else {}

    def once() -> None:
        n, begun = 0, time.monotonic()
        with fs.open(path, "rb", **options) as src:
            while block := src.read(CHUNK):
                into.write(block, n)
                n += len(block)
                if time.monotonic() - begun > policy.timeout + n / FLOOR_RATE:  # a trickle: http_ranges's floor
                    raise Stalled(f"the body came at {n / (time.monotonic() - begun):.0f} B/s, below the floor of "
                                  f"{FLOOR_RATE >> 10} KiB/s, for longer than the {policy.timeout:g} s timeout "
                                  "(a stalled store)")
        if nbytes is not None and n < nbytes:  # no Content-Length to tell aiohttp it was cut
            raise ShortBody(f"the body ended after {n} of {nbytes} bytes")
        os.ftruncate(into.fd, n)  # a retry may have written less than a longer try before it

    attempt = lambda: with_retries(url, policy, once)  # noqa: E731
    attempt() if pool is None else pool.submit(attempt).result()


def _parts(url: str, into: Into, dest: str, nbytes: int, pool, policy: RemotePolicy, probe: bool) -> None:
    """All of a large file as ranged GETs of PART bytes run on `pool` (each retried alone), written
    in place. `probe`: the first PROBE bytes alone first (RangeIgnored, one whole-file GET spent,
    when the store ignores Range); without it all parts go at once (a client that tells a refused
    range from the answer's headers: store.remote.refused_at_headers). The parts are posted on a
    board (reader.parts_board), where another process that wants the file while its connections
    have room takes some of them (help_with); those it fails or dies in are fetched here."""
    failed = threading.Event()

    def get(start: int, end: int) -> None:
        into.write(read_range(url, start, end, policy, _buffer(end - start)), start)

    first = 0
    if probe:  # a small first range: costs one round trip when Range works, one file when not
        first = min(PROBE, PART)  # < nbytes: a store that ignores Range sends more than asked
        pool.submit(get, 0, first).result()
    try:
        board = parts_board.Owned(dest, into.path, first, nbytes, PART)
    except OSError as e:
        raise DiskError(e, into.folder, url) from e
    _track(board.path)
    try:
        _own_parts(board, get, pool, failed)
        board.wait_for_others(get, failed, _patience(policy))
    finally:
        board.remove()
        _ACTIVE.discard(board.path)


def _own_parts(board: parts_board.Owned, get, pool, failed: threading.Event) -> None:
    """A task per part on `pool`, each taking the next part no process holds (those a helper took
    are left to it); the first that fails for good stops the others from starting and is raised."""

    def one() -> None:
        i = None if failed.is_set() else board.take()
        if i is None:
            return
        try:
            get(*board.parts[i])
        except BaseException:
            failed.set()
            board.give_back(i)
            raise
        board.done(i)

    futures = [pool.submit(one) for _ in board.parts]
    done, _ = wait(futures, return_when=FIRST_EXCEPTION)
    for f in futures:
        if f in done and f.exception() is not None:
            failed.set()
            wait(futures)  # no part may write into the file after it is removed
            raise f.exception()


def _patience(policy: RemotePolicy) -> float:
    """The longest a helper's part may take with every try: each try's timeout plus a PART body at
    FLOOR_RATE (http_ranges's floor), and the backoffs between them."""
    tries = policy.retries + 1
    return tries * (policy.timeout + PART / FLOOR_RATE) + policy.backoff * (2 ** policy.retries - 1) + 1.0


def help_with(dest: str, url: str, nbytes: int, policy: RemotePolicy, pool) -> int:
    """Parts of another process's download of `url` into `dest` (reader.parts_board), fetched on
    `pool` (this process's connections) and written into its temp file; returns the bytes written.
    Parts are taken as this pool's threads come free, so a busy process takes none. At its first
    part that fails (left to the owner, which fetches it and reports what fails there), or once
    the owner is gone, it takes no more: a failed part given back would be its own next take.
    RangeIgnored is raised once its tasks ended: the store sends whole files."""
    joined = parts_board.join(dest, nbytes, PART)
    if joined is None:
        return 0
    helping = _Helping(*joined, url, policy)
    try:
        helping.futures.extend(pool.submit(helping.one) for _ in helping.board.parts)
        wait(helping.futures)
    finally:
        helping.board.close()
        os.close(helping.fd)
    if helping.refused:
        raise helping.refused[0]
    return sum(f.result() for f in helping.futures if not f.cancelled() and f.exception() is None)


class _Helping:
    """One process's help with another's download: `one()`, run on a connection, takes a part."""

    def __init__(self, board, fd: int, url: str, policy: RemotePolicy):
        self.board, self.fd, self.url, self.policy = board, fd, url, policy
        self.stop, self.futures, self.refused = threading.Event(), [], []

    def one(self) -> int:
        board = self.board
        i = None if self.stop.is_set() or not board.owner_alive() else board.take()
        if i is None:  # nothing left to take, or no reason to: the tasks still queued need not wait
            self.stop.set()
            for f in self.futures:
                f.cancel()
            return 0
        start, end = board.parts[i]
        try:
            _pwrite_all(self.fd, read_range(self.url, start, end, self.policy, _buffer(end - start)), start)
        except Exception as e:  # noqa: BLE001 — the owner fetches the part again and reports its own error
            log.debug("helping with %s: bytes %d-%d failed (left to the process fetching it): %s", self.url, start,
                      end - 1, e)
            board.give_back(i)
            self.stop.set()
            if isinstance(e, RangeIgnored):
                self.refused.append(e)
            return 0
        board.done(i)
        return end - start


def download(url: str, dest: str, sha256: str, nbytes: int | None, policy: RemotePolicy | None = None,
             pool=None, ranges: bool | None = None, verify: bool = True, folder: str | None = None) -> bool | None:
    """Copy `url` to `dest` (temp + rename), `nbytes` long as the manifest says.

    With a thread `pool` (its threads are the connections), a file of more than one PART is
    fetched as parallel ranged GETs written in place, so one large shard is not capped at one
    connection's speed. `ranges`: whether the store honours Range (None: not known yet, the first
    part is tried alone); a store that ignores it is read with one streamed GET. `verify` (or
    verify(temp path), asked once the bytes are in): check the whole file's sha256, a second pass
    over it, which a reader that checks every value it reads against its own checksum does not need. `folder` (the cache) is what a failed local write
    names. Returns what was learnt about Range (None when nothing was)."""
    policy = policy or RemotePolicy()
    into = Into(tmp_name(dest), folder or os.path.dirname(dest), url, nbytes)
    learnt = None
    try:
        try:
            if pool is None or not nbytes or nbytes <= PART or ranges is False:
                _small(url, into, nbytes, policy, pool, ranges)
            else:
                _parts(url, into, dest, nbytes, pool, policy, probe=ranges is None and not refused_at_headers(url))
                learnt = True
        except RangeIgnored:
            learnt = False
            _stream(url, into, nbytes, policy, pool)
        _check(url, into.path, sha256, nbytes, verify)
    except RemoteError as e:
        _discard(into)
        raise ShardError(f"cannot fetch shard {url}: {e.detail}") from e
    except BaseException:
        _discard(into)
        raise
    into.close()
    os.replace(into.path, dest)
    _ACTIVE.discard(into.path)
    return learnt


def _small(url: str, into: Into, nbytes: int | None, policy: RemotePolicy, pool, ranges: bool | None) -> None:
    """A file of at most one PART (or any file, without a pool): one GET of the whole file, held in
    memory when it is at most one PART, else streamed into the file."""
    if not nbytes or nbytes > PART or ranges is False:
        _stream(url, into, nbytes, policy, pool)
        return
    get = lambda: read_bytes(url, policy, nbytes)  # noqa: E731
    into.write(get() if pool is None else pool.submit(get).result(), 0)


def _check(url: str, path: str, sha256: str, nbytes: int | None, verify: bool) -> None:
    """The file is the manifest's: its size always, its sha256 when `verify`."""
    n = os.path.getsize(path)
    if nbytes is not None and n != nbytes:
        raise ShardError(f"shard {url} has {n} bytes on the store, the manifest says {nbytes}: it was replaced since "
                         "the build; rebuild or re-upload the dataset")
    if not (verify(path) if callable(verify) else verify):
        return
    digest = sha256_file(path)
    if digest != sha256:
        raise ShardError(f"checksum mismatch for shard {url}: got sha256 {digest[:16]}… ({n} bytes, the size the "
                         f"manifest records), the manifest says {sha256[:16]}…; the remote copy is corrupt or changed "
                         "since the build: rebuild or re-upload the dataset")


def _discard(into: Into) -> None:
    with contextlib.suppress(OSError):
        into.close()
    with contextlib.suppress(FileNotFoundError):
        os.remove(into.path)
    _ACTIVE.discard(into.path)
