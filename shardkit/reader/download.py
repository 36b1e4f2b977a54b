"""Downloading one remote file into a temp file beside its cache path: one streamed GET, or a large
file as parallel ranged GETs written in place; checked against the manifest's sha256 and size."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from concurrent.futures import FIRST_EXCEPTION, wait

from shardkit.errors import ShardError
from shardkit.fs import RemotePolicy, RemoteError, filesystem, sha256_file, tmp_name, with_retries

CHUNK = 1 << 20
# Bytes per ranged GET of a large file. At 25 MB/s per connection and 50 ms to the first byte a
# 4 MiB part spends 77% of its time transferring (8 MiB: 87%), and each part in flight holds its
# bytes in memory: connections x PART per process (32 MiB at 8 connections).
PART = 4 << 20
PROBE = 64 << 10  # the range that finds out whether a store honours Range


def _fetch_once(fs, path: str, tmp: str, nbytes: int | None) -> str:
    """One try: stream the file into tmp (rewritten from the start); returns its sha256."""
    h = hashlib.sha256()
    # http(s): one streamed GET; its size comes from the manifest, not from a HEAD request.
    options = {"block_size": 0, "size": nbytes} if path.startswith(("http://", "https://")) and nbytes else {}
    with fs.open(path, "rb", **options) as src, open(tmp, "wb") as out:
        while block := src.read(CHUNK):
            h.update(block)
            out.write(block)
    return h.hexdigest()


class RangeIgnored(ValueError):  # a ValueError: never retried
    """The store answered a Range request with other bytes than asked (it ignores Range)."""


def _fetch_parts(fs, url: str, path: str, tmp: str, nbytes: int, pool, policy: RemotePolicy,
                 probe: bool = False) -> str:
    """All of a large file as ranged GETs of PART bytes run on `pool` (each retried alone), written
    in place into tmp; returns its sha256 (read back: the parts arrive out of order). `probe`: the
    first PROBE bytes alone first (RangeIgnored, one whole-file GET spent, when the store ignores Range)."""
    with open(tmp, "wb") as f:
        f.truncate(nbytes)  # full size at once: the cache's listing counts it while it fills
    fd = os.open(tmp, os.O_WRONLY)
    failed = threading.Event()

    def part(start: int, end: int) -> None:
        if failed.is_set():  # another part failed for good: do not start this one
            return
        data = fs.cat_file(path, start=start, end=end)
        if len(data) != end - start:
            raise RangeIgnored(f"asked bytes {start}-{end - 1}, got {len(data)} bytes")
        os.pwrite(fd, data, start)

    def one(start: int, end: int) -> None:
        try:
            with_retries(url, policy, lambda: part(start, end))
        except BaseException:
            failed.set()
            raise

    try:
        first = 0
        if probe:  # a small first range: costs one round trip when Range works, one file when not
            first = min(PROBE, PART)  # < nbytes: a store that ignores Range sends more than asked
            pool.submit(one, 0, first).result()
        futures = [pool.submit(one, start, min(start + PART, nbytes)) for start in range(first, nbytes, PART)]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f in done and f.exception() is not None:
                failed.set()
                wait(futures)  # no part may write into tmp after it is removed
                raise f.exception()
    finally:
        os.close(fd)
    return sha256_file(tmp)


def download(url: str, dest: str, sha256: str, nbytes: int | None, policy: RemotePolicy | None = None,
             pool=None, ranges: bool | None = None) -> bool | None:
    """Copy `url` to `dest` (temp + rename) after checking its sha256 and size against the manifest.

    With a thread `pool` (its threads are the connections), a file of more than one PART is
    fetched as parallel ranged GETs, so one large shard is not capped at one connection's speed.
    `ranges`: whether the store honours Range (None: not known yet, the first part is tried
    alone); a store that ignores it is read with one streamed GET. Returns what was learnt
    about Range (None when nothing was)."""
    policy = policy or RemotePolicy()
    fs, path = filesystem(url, policy)
    tmp = tmp_name(dest)
    learnt = None
    try:
        try:
            if pool is None or not nbytes or nbytes <= PART or ranges is False:
                raise RangeIgnored("one GET")
            digest = _fetch_parts(fs, url, path, tmp, nbytes, pool, policy, probe=ranges is None)
            learnt = True
        except RemoteError as e:
            if not isinstance(e.__cause__, RangeIgnored):
                raise
            learnt, digest = False, _stream(fs, url, path, tmp, nbytes, policy, pool)
        except RangeIgnored:
            digest = _stream(fs, url, path, tmp, nbytes, policy, pool)
    except RemoteError as e:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise ShardError(f"cannot fetch shard {url}: {e.detail}") from e
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    n = os.path.getsize(tmp)
    if digest != sha256 or (nbytes is not None and n != nbytes):
        os.remove(tmp)
        raise ShardError(f"checksum mismatch for shard {url}: got sha256 {digest[:16]}… ({n} bytes), "
                         f"the manifest says {sha256[:16]}… ({nbytes} bytes); the remote copy is corrupt or "
                         "changed since the build: rebuild or re-upload the dataset")
    os.replace(tmp, dest)
    return learnt


def _stream(fs, url: str, path: str, tmp: str, nbytes: int | None, policy: RemotePolicy, pool) -> str:
    """One streamed GET with retries; on the pool when there is one, so that it holds a connection."""
    def attempt():
        return with_retries(url, policy, lambda: _fetch_once(fs, path, tmp, nbytes))

    return attempt() if pool is None else pool.submit(attempt).result()
