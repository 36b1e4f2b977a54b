"""A large file's parts shared between the processes of one cache: the process that claimed the file
downloads it (reader.download), and another process that wants the same file while its own
connections have room takes some of its parts instead of waiting.

Why: a fetch claims a whole shard (its lock, reader.cache), so when a few large shards start at
once one process may hold more parts than it has connections while another's sit idle. Traced on
the remote bench (6,000 JPEGs in shards of 19 MB, 2 workers): the last two parts of one shard went
out 0.25 s after the others, when the claiming process's first parts ended.

The board is a file beside the download's temp file (`dest.tmp-parts`, so that the cache's clean-up
of a killed fetch's temp files removes it too): a header naming the temp file and the parts, then
one byte per part, 1 once the part is written. A part is taken with a POSIX record lock on its
byte (fcntl.lockf), which the kernel drops when its holder dies, so a helper killed mid-part leaves
nothing stuck: the owner takes the part back and downloads it itself. A helper's part that fails
is left undone the same way, and a helper stops at its first failure (it would take the same part
again) or once the owner is gone (the owner holds byte 0 for as long as it runs). Record locks
belong to a process, not a thread, so a process's own threads share them through `_Board.taken`,
a process is owner or helper of a board, never both, and never two helpers (_open_owned,
_open_helped), and it keeps one descriptor of the board open for as long as it uses it (closing
any descriptor of a file drops the process's locks on it).
The owner checks the whole file when it is complete (size, and sha256 or every value's checksum),
so a helper's bytes are trusted no more than its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time

log = logging.getLogger(__name__)

SUFFIX = ".tmp-parts"
# Bytes before the part bytes: "temp-file-name first nbytes part\n" (a name is at most 255 bytes on
# Linux, each number at most 20 digits: 319 at most); byte 0 is also the owner's lock.
HEADER = 512
POLL_S = 0.005  # how often the owner looks again at a part a helper holds
NO_BOARD_S = 0.02  # how long a helper looks for the board of a download that has just been claimed
# This process's boards, by real path: those it owns (path -> count) and those it helps with. A
# process opens a board it owns only through Owned: any other descriptor of the file closed in it
# would drop the owner's record locks (they belong to the process, and close() drops them all).
_HERE: dict = {"owned": {}, "helped": set()}
_HERE_LOCK = threading.Lock()


def _forked() -> None:
    """A forked child: its parent's boards are not its own, and the lock may have been copied held."""
    global _HERE_LOCK
    _HERE_LOCK = threading.Lock()
    _HERE.update(owned={}, helped=set())


os.register_at_fork(after_in_child=_forked)


def board_path(dest: str) -> str:
    return dest + SUFFIX


def spans(first: int, nbytes: int, part: int) -> list[tuple[int, int]]:
    return [(start, min(start + part, nbytes)) for start in range(first, nbytes, part)]


def _open_owned(path: str) -> int:
    """A fresh board at `path`, counted as owned here, its byte 0 locked (the owner is alive),
    in one step under the registry's lock: a helper thread of this process never opens it."""
    key = os.path.realpath(path)
    with _HERE_LOCK:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)  # a new inode: a descriptor of an old board held here is not this one's
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)  # held until the board goes: helpers see the owner alive
        except BaseException:
            os.close(fd)
            raise
        _HERE["owned"][key] = _HERE["owned"].get(key, 0) + 1
    return fd


def _open_helped(path: str) -> int | None:
    """A descriptor of another process's board at `path`, counted as helped here; None when this
    process owns it or helps with it already (two helpers in one process would share their record
    locks), or there is none."""
    key = os.path.realpath(path)
    with _HERE_LOCK:
        if key in _HERE["owned"] or key in _HERE["helped"]:
            return None
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        _HERE["helped"].add(key)
    return fd


def _close(fd: int, path: str, owned: bool) -> None:
    key = os.path.realpath(path)
    with _HERE_LOCK:
        os.close(fd)
        if not owned:
            _HERE["helped"].discard(key)
        elif _HERE["owned"].get(key, 0) > 1:
            _HERE["owned"][key] -= 1
        else:
            _HERE["owned"].pop(key, None)


class _Board:
    """One process's handle on a board: take(), done(i), give_back(i)."""

    def __init__(self, fd: int, parts: list[tuple[int, int]], path: str):
        self.fd, self.parts, self.path = fd, parts, path
        self.taken: set[int] = set()  # parts this process's threads hold (record locks do not tell them apart)
        self.written: set[int] = set()  # parts seen done: a done part stays done, so take() skips it unlocked
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """The first part no process holds and none has written, now held by this thread; None when
        every part is done or held."""
        with self._lock:
            for i in range(len(self.parts)):
                if i in self.taken or i in self.written:
                    continue
                try:
                    fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, HEADER + i)
                except (BlockingIOError, PermissionError):  # another process holds it
                    continue
                if self.is_done(i):
                    self.written.add(i)
                    fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, HEADER + i)
                    continue
                self.taken.add(i)
                return i
        return None

    def is_done(self, i: int) -> bool:
        return os.pread(self.fd, 1, HEADER + i) == b"\x01"

    def done(self, i: int) -> None:
        os.pwrite(self.fd, b"\x01", HEADER + i)
        with self._lock:
            self.written.add(i)
        self.give_back(i)

    def give_back(self, i: int) -> None:
        with self._lock:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, HEADER + i)
            self.taken.discard(i)

    def owner_alive(self) -> bool:
        """Whether the download's owner still runs (it holds byte 0 for as long as it does): a
        helper of an owner killed mid-download stops, instead of fetching the rest for nothing."""
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 0)
        except (BlockingIOError, PermissionError):
            return True
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)
        return False

    def close(self) -> None:
        _close(self.fd, self.path, isinstance(self, Owned))


class Owned(_Board):
    """The board of a download this process claimed: made with every part undone."""

    def __init__(self, dest: str, temp: str, first: int, nbytes: int, part: int):
        path = board_path(dest)
        parts = spans(first, nbytes, part)
        header = f"{os.path.basename(temp)} {first} {nbytes} {part}\n".encode()
        fd = _open_owned(path)
        super().__init__(fd, parts, path)
        try:
            os.pwrite(fd, header.ljust(HEADER, b" ") + bytes(len(parts)), 0)
        except BaseException:
            self.remove()
            raise

    def wait_for_others(self, fetch, failed: threading.Event, patience: float) -> None:
        """Once this process's own tasks ended: each part still undone is a helper's in progress
        (waited for), or a helper's that failed or died (fetched here: fetch(start, end)). A part a
        helper holds for longer than `patience` seconds (more than its GET may take with every
        retry: a helper stopped or stuck) is fetched here as well; a late write of the helper's
        carries the same bytes."""
        deadline = time.monotonic() + patience  # one for the whole wait: a stopped helper may hold many parts
        for i, (start, end) in enumerate(self.parts):
            while not failed.is_set():
                try:
                    fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, HEADER + i)
                except (BlockingIOError, PermissionError):
                    if time.monotonic() < deadline:
                        # Polled, not a blocking lock: the kernel may take two processes that help
                        # each other for a deadlock (EDEADLK), though neither waits on the other.
                        time.sleep(POLL_S)
                        continue
                    log.debug("a helper held bytes %d-%d for over %.0f s: fetched here", start, end - 1, patience)
                    fetch(start, end)
                    os.pwrite(self.fd, b"\x01", HEADER + i)
                    break
                try:
                    if not self.is_done(i):
                        fetch(start, end)
                        os.pwrite(self.fd, b"\x01", HEADER + i)
                finally:
                    fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, HEADER + i)
                break

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)  # before its lock goes: a helper that opens it after finds none
        with contextlib.suppress(OSError):
            self.close()


def join(dest: str, nbytes: int | None, part: int) -> tuple[_Board, int] | None:
    """(board, descriptor of the temp file to write into) of another process's download of `dest`
    whose parts match this process's (`nbytes`, `part`); None when there is none, it is not split
    in parts, it ended meanwhile, its owner died, or this process owns it or helps with it already.
    Looks for NO_BOARD_S for a board that is about to be made."""
    path, deadline = board_path(dest), time.monotonic() + NO_BOARD_S
    while (fd := _open_helped(path)) is None:
        if time.monotonic() >= deadline or os.path.exists(dest) or os.path.realpath(path) in _HERE["owned"]:
            return None
        time.sleep(POLL_S)
    board = _Board(fd, [], path)
    try:
        name, first, total, size = os.pread(fd, HEADER, 0).split(b"\n", 1)[0].decode().split(" ")
        if int(total) != nbytes or int(size) != part or os.sep in name:
            raise ValueError(f"a board for {total} bytes in parts of {size}")
        if not board.owner_alive():  # a killed owner's board, before the next owner removes it
            raise ValueError("its owner is gone")
        out = os.open(os.path.join(os.path.dirname(dest), name), os.O_WRONLY)
    except (OSError, ValueError) as e:  # the download ended (its temp file gone) or is not ours to join
        log.debug("not helping with %s: %s", dest, e)
        board.close()
        return None
    board.parts = spans(int(first), nbytes, part)
    return board, out
