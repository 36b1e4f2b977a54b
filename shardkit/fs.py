"""File access through fsspec, and atomic writes (temp file, fsync, rename)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from pathlib import Path

def is_remote(url: str) -> bool:
    return "://" in str(url) and not str(url).startswith("file://")


def local_path(url: str) -> str:
    """'file:///x' -> '/x'; plain paths unchanged."""
    url = str(url)
    return url[len("file://"):] if url.startswith("file://") else url


def join(base: str, rel: str) -> str:
    base = str(base)
    if is_remote(base):
        return base.rstrip("/") + "/" + rel
    return os.path.join(local_path(base), rel)


def open_url(url: str, mode: str = "rb"):
    """Open a local path or any fsspec URL (http(s)://, s3:// with s3fs installed, ...)."""
    if not is_remote(url):
        return open(local_path(url), mode)
    import fsspec  # heavy: only when reading remote data

    return fsspec.open(url, mode).open()


def remote_hint(url: str, error: BaseException) -> str:
    """What fixes a failed remote read, when the cause is a known one ('' otherwise)."""
    text = f"{type(error).__name__} {error}".lower()
    scheme = str(url).split("://", 1)[0]
    if isinstance(error, ImportError):
        extra = {"s3": "s3", "http": "http", "https": "http"}.get(scheme)
        return f"; install the {scheme}:// backend: pip install 'shardkit[{extra}]'" if extra else ""
    if scheme == "s3" and "credential" in text:
        return ("; give S3 credentials the usual way: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, or "
                "AWS_PROFILE naming a profile in ~/.aws/credentials (an S3-compatible server: AWS_ENDPOINT_URL)")
    return ""


def read_bytes(url: str) -> bytes:
    with open_url(url, "rb") as f:
        return f.read()


def tmp_name(path: str | os.PathLike) -> str:
    """A temp name beside `path`, unique per writer so retried tasks never share one."""
    path = str(path)
    return f"{path}.tmp-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb"):
    """Write to a temp file beside `path`; on success fsync and rename over it, else remove it.

    A reader therefore sees either the old file, the complete new one, or nothing: never a
    partial file under the final name.
    """
    path = str(path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


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
