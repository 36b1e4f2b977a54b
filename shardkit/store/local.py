"""Paths (local or URL: is_url, join, local_path), atomic local writes (temp, then rename), checksums."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from pathlib import Path


def is_url(location: str) -> bool:
    """Whether `location` names a remote store (file:// and plain paths are local)."""
    return "://" in str(location) and not str(location).startswith("file://")


def local_path(url: str) -> str:
    """'file:///x' -> '/x'; plain paths unchanged."""
    url = str(url)
    return url[len("file://"):] if url.startswith("file://") else url


def join(base: str, *parts: str) -> str:
    """A path below a local folder or a URL."""
    base = str(base)
    if is_url(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(local_path(base), *parts)


def tmp_name(path: str | os.PathLike) -> str:
    """A temp name beside `path`, unique per writer so retried tasks never share one."""
    path = str(path)
    return f"{path}.tmp-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb", *, durable: bool = True):
    """Write to a temp file beside `path`; on success fsync and rename over it, else remove it.

    A reader therefore sees either the old file, the complete new one, or nothing: never a
    partial file under the final name. `durable=False` leaves the fsync to the caller (see
    `fsync_path`), for a writer that must not wait on the disk.
    """
    path = str(path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a written file's data to the disk (any descriptor of the file will do)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write all of `data` to `path` atomically (see atomic_writer)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_writer(path, "wb") as f:
        f.write(data)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
