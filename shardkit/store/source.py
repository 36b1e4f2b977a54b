"""A source file on a store read as a local one: seekable, its waits bounded, resumed after a failure."""

from __future__ import annotations

import io

from shardkit.store.calls import filesystem, retry


class ResumingFile(io.RawIOBase):
    """A remote file opened for reading (store.open_source). Every read waits at most the policy's
    timeout; a read that fails in a way that may pass reopens the file at the offset reached and tries
    again (the policy's retries, backoff between tries), so a long stream (a tar of many members, a
    Parquet file read by row group) survives a reset connection without starting over."""

    def __init__(self, url: str):
        super().__init__()
        self.url, self.pos = url, 0
        self._fs, self._path = filesystem(url)
        self._f = retry(url, self._open)

    def _open(self):
        return self._fs.open(self._path, "rb")

    @property
    def size(self) -> int:
        return self._f.size

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
        data = retry(self.url, lambda: self._read_once(n))
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
