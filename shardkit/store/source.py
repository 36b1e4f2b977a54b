"""A source file on a store read as a local one: seekable, its waits bounded, resumed after a failure."""

from __future__ import annotations

import io

from shardkit.store.remote import RemoteError, RemotePolicy, strip_protocol
from shardkit.store.calls import _call, _policy, client, filesystem, retry
from shardkit.store.local import is_url


class ResumingFile(io.RawIOBase):
    """A remote file opened for reading (store.open_source). Every read waits at most the policy's
    timeout; a read that fails in a way that may pass reopens the file at the offset reached and tries
    again (the policy's retries, backoff between tries), so a long stream (a tar of many members, a
    Parquet file read by row group) survives a reset connection without starting over."""

    def __init__(self, url: str, policy: RemotePolicy | None = None):
        super().__init__()
        self.url, self.pos, self.policy = url, 0, policy
        self._fs, self._path = client(url, policy)  # obstore's where it serves s3://, else fsspec's
        self._f = retry(url, self._open, policy=policy)
        self._size = self._f.size  # kept: after a failed read the file is reopened only by the next read

    def _open(self):
        from shardkit.store import objstore

        if isinstance(self._fs, objstore.Client):
            return _Ranged(self._fs, self._path)
        return self._fs.open(self._path, "rb")

    @property
    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _read_once(self, n: int) -> bytes:
        if self._f is None:  # the previous try broke the connection: reopen where we are
            self._f = self._open()
        try:
            self._f.seek(self.pos)
            return self._f.read(n)
        except Exception:
            f, self._f = self._f, None
            try:
                f.close()
            except Exception:  # noqa: BLE001 — a broken file may fail to close too; it is dropped
                pass
            raise

    def read(self, n: int = -1) -> bytes:
        data = retry(self.url, lambda: self._read_once(n), policy=self.policy)
        self.pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        super().close()


class _Ranged:
    """An object read by ranged GETs on obstore's client (ResumingFile's file there): a read within
    the block in hand is served from it, else the next BLOCK bytes are fetched (a read larger than a
    block is one GET of its own). Read as a stream, the AHEAD blocks after are fetched in the
    background meanwhile, so a stream waits no round trip per block (s3fs's file reads ahead in
    50 MiB blocks): at most 1 + AHEAD blocks held per open file."""

    BLOCK, AHEAD = 16 << 20, 3  # bytes a GET; blocks of a stream fetched ahead of the one it reads

    def __init__(self, fs, path: str):
        import collections

        self.fs, self.path = fs, path
        self.size = int(fs.info(path)["size"])
        self._pos, self._at, self._block = 0, 0, b""
        self._ahead = collections.deque()  # (offset, a concurrent Future of the block there), in order

    def seek(self, pos: int) -> int:
        self._pos = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self._pos + n)
        if self._pos >= end:
            return b""
        if end - self._pos > self.BLOCK:
            data = self.fs.cat_file(self.path, self._pos, end)
            self._pos += len(data)
            return data
        parts = []
        while self._pos < end:  # a read across a block's end: its tail, then the block after
            if not self._at <= self._pos < self._at + len(self._block):
                self._load(self._pos)
                if not self._block:  # the object is shorter than it was: a short read
                    break
            part = self._block[self._pos - self._at:end - self._at]
            parts.append(part)
            self._pos += len(part)
        return b"".join(parts)

    def _load(self, at: int) -> None:
        from shardkit.store import objstore

        sequential = at == 0 or bool(self._block) and at == self._at + len(self._block)  # a stream's start, its next
        while self._ahead and self._ahead[0][0] < at:  # passed over
            self._ahead.popleft()[1].cancel()
        block = None
        if self._ahead and self._ahead[0][0] == at:
            try:
                block = self._ahead.popleft()[1].result()
            except Exception:  # noqa: BLE001 — read again below, in the caller's thread and retries
                pass
        elif self._ahead:  # a seek elsewhere
            self._cancel()
        if sequential:  # the blocks after this one, asked for before it is (blocks are BLOCK long but the last)
            url = f"{self.fs.protocol}://{self.path}"
            after = (self._ahead[-1][0] if self._ahead else at) + self.BLOCK
            while len(self._ahead) < self.AHEAD and after < self.size:
                self._ahead.append((after, objstore.fetch_range(url, after, min(self.size, after + self.BLOCK),
                                                                 self.fs.timeout)))
                after += self.BLOCK
        if block is None:
            block = self.fs.cat_file(self.path, at, min(self.size, at + self.BLOCK))
        self._at, self._block = at, block

    def _cancel(self) -> None:
        while self._ahead:
            self._ahead.popleft()[1].cancel()

    def close(self) -> None:
        self._cancel()
        self._block = b""


class Fetch:
    """Whole source files fetched concurrently in the background (store.fetch_sources)."""

    def __init__(self, urls: list[str], policy: RemotePolicy | None = None):
        self.urls, self.future, self.paths, self.policy = urls, None, list(urls), policy
        from shardkit.store import objstore

        self.slack = 0.0  # seconds the fetch may take beyond the policy's waits
        if urls and objstore.serves(urls[0]):  # on obstore: sync GETs in its pool's threads, a window at a time
            self.future = objstore.fetch_many(urls, _policy(policy).timeout)
            self.slack = objstore.WHOLE / objstore.MIN_RATE  # each GET bounded as a whole: 2 x timeout + this
            return
        fs = filesystem(urls[0], policy)[0] if urls and is_url(urls[0]) else None
        if getattr(fs, "async_impl", False):  # s3fs, gcsfs, adlfs, http: concurrent requests on fsspec's loop
            import asyncio

            self.paths = [strip_protocol(fs, url) for url in urls]
            self.future = asyncio.run_coroutine_threadsafe(fs._cat(self.paths, on_error="return"), fs.loop)

    def result(self) -> list:
        """Each file's bytes, or the exception reading it raised, in order. What the concurrent fetch did
        not bring (a failure, or no answer within the policy's bound) is read alone, with retries."""
        got = {}
        if self.future is not None:
            p = _policy(self.policy)
            try:
                got = self.future.result(timeout=2 * p.timeout + self.slack + 4 * len(self.urls) * p.timeout / 64)
            except BaseException as e:  # noqa: BLE001 — every file is then read alone, its errors named
                self.future.cancel()  # an interrupt too: the batch does not go on fetching
                if not isinstance(e, Exception):
                    raise
        out = []
        if isinstance(got, list):  # obstore's answers, in order
            got = dict(zip(self.paths, got))
        for i, url in enumerate(self.urls):
            value = got.get(self.paths[i]) if got else None
            if not isinstance(value, bytes):
                try:
                    value = _read(url, self.policy)
                except (OSError, RemoteError) as e:
                    value = e
            out.append(value)
        return out


def _read(url: str, policy: RemotePolicy | None) -> bytes:
    """A whole source file, local or remote (store.read_source)."""
    if not is_url(url):
        from shardkit.store.local import local_path

        with open(local_path(url), "rb") as f:
            return f.read()
    return _call(url, lambda fs, path: fs.cat_file(path), policy=policy)
