"""One writer per local output folder: an flock, and this process's register of the folders it holds."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time

from shardkit.errors import FolderLocked


LOCK_FILE = os.path.join(".shardkit", "lock")
_HELD: dict[str, list] = {}  # lock files and lease URLs this process holds -> [depth, command, since]


@contextlib.contextmanager
def folder_lock(folder: str, command: str, within: str | None = None):
    """One writer per output folder: an exclusive flock on FOLDER/.shardkit/lock for the whole run.

    A second build or dedup into the same folder fails at once with FolderLocked naming the
    holder (pid, host, start). The kernel drops a flock when its process ends, however it ends,
    so a build killed with kill -9 leaves no stale lock; the file itself stays (deleting it would
    let two processes lock two different files under one name). A second writer in this same
    process is refused too (two ShardWriters on one folder would lose the first one's samples),
    except the one named by `within`: the holder's command whose run this one is part of
    (`dedup RAW OUT` runs a build into the OUT it holds).
    """
    path = os.path.join(folder, LOCK_FILE)
    fresh = not os.path.lexists(folder)  # made here: a run that fails before writing anything removes it
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = None

    def take():
        nonlocal fd
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace")
            os.close(fd)
            raise FolderLocked(f"{folder} is being written by {_holder(holder)}; wait for it to end or choose another "
                               f"output folder (the lock, {path}, is released when that process ends, even if "
                               "killed)") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}).encode())

    on_fail = (lambda: _remove_if_untouched(folder, path)) if fresh else None
    with held(os.path.realpath(path), folder, command, within, take, lambda: os.close(fd), on_fail):
        yield


@contextlib.contextmanager
def held(key: str, folder: str, command: str, within: str | None, take, release, on_fail=None):
    """The one in-process rule of every lock (a local flock here, a store's lease in store/lease.py):
    the first holder of `key` runs take() ... release(); a second writer in this process is refused
    with FolderLocked, except one named by `within`, the holder's command whose run it is part of.
    on_fail() runs, the lock still held, when the run raises (folder_lock: a folder it made and the
    run left empty is removed)."""
    if key in _HELD:
        depth, holder, since = _HELD[key]
        if within is None or holder != within:
            raise FolderLocked(f"{folder} is being written by `{holder}` in this process (pid {os.getpid()}, since "
                               f"{since}); close that writer first, or choose another output folder")
        _HELD[key][0] += 1
        try:
            yield
        finally:
            _HELD[key][0] -= 1
        return
    take()
    _HELD[key] = [1, command, time.strftime("%Y-%m-%d %H:%M:%S %z")]
    try:
        yield
    except BaseException:
        if on_fail is not None:
            on_fail()
        raise
    finally:
        del _HELD[key]
        release()


def _remove_if_untouched(folder: str, path: str) -> None:
    """A folder that folder_lock made, given back as it was (absent) when the run wrote nothing in it
    but the lock: a failed start leaves nothing behind. Done with the lock still held, so no other
    writer holds this file (one that opened it meanwhile fails at once: LOCK_NB)."""
    state = os.path.dirname(path)
    try:
        if os.listdir(folder) != [os.path.basename(state)] or os.listdir(state) != [os.path.basename(path)]:
            return
        os.remove(path)
        os.rmdir(state)
        os.rmdir(folder)
    except OSError:  # written meanwhile, or not ours to remove: left as it is
        pass


def _holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"`{h['command']}` (pid {h['pid']} on host {h['host']}, since {h['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process (it is starting: no details yet)"
