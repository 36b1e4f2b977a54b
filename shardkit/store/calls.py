"""The calls to a store: one fsspec filesystem per process and protocol, its waits bounded by the
job's RemotePolicy, every call retried by fs.with_retries, errors naming the URL."""

from __future__ import annotations

import os
import threading

from shardkit.fs import RemoteError, RemotePolicy, local_path, with_retries
from shardkit.store.urls import is_url, missing_backend

_STATE = {"policy": RemotePolicy(), "fix": "shardkit build --timeout/--retries"}
_READER_FIX = "StreamingDataset(timeout=..., retries=...)"  # what fs.with_retries names as the fix
_FS: dict = {}
_FS_LOCK = threading.Lock()


def use_policy(p: RemotePolicy | None, fix: str = "shardkit build --timeout/--retries") -> None:
    """The waits and retries of this process's store calls (a job sets its own; its tasks set the
    job's), and the options a user changes to allow a slower store (named in errors)."""
    _STATE["policy"], _STATE["fix"] = p or RemotePolicy(), fix


def policy() -> RemotePolicy:
    return _STATE["policy"]


def join(base: str, *parts: str) -> str:
    """A path below a local folder or a URL."""
    if is_url(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(local_path(base), *parts)


def filesystem(url: str):
    """(fsspec filesystem, path) with this process's policy: connect and read timeouts, and no retry
    loop of the backend's own (s3fs retries 5 times by default), so `with_retries` is the only one."""
    p = policy()
    protocol = url.split("://", 1)[0]
    key = (os.getpid(), protocol, p.timeout)
    with _FS_LOCK:
        fs = _FS.get(key)
        if fs is None:
            try:
                import fsspec

                fs = fsspec.filesystem(protocol, skip_instance_cache=True, **_options(protocol, p))
            except ImportError as e:
                raise missing_backend(protocol, e, "URL", url) from None
            if hasattr(fs, "retries"):
                fs.retries = 1
            _FS[key] = fs
    return fs, fs._strip_protocol(url)


def _options(protocol: str, p: RemotePolicy) -> dict:
    if protocol in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": p.timeout, "read_timeout": p.timeout,
                                  "retries": {"total_max_attempts": 1}}, "session": _s3_session()}
    if protocol in ("http", "https"):
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=p.timeout,
                                                                   sock_read=p.timeout)}}
    return {}


class WriteError(RemoteError):
    """A file could not be written to a store: `detail` says why and what was tried."""

    def __init__(self, url: str, detail: str, not_found: bool = False):
        super().__init__(url, detail, not_found)
        self.args = (f"cannot write {url}: {detail}",)


MIN_RATE = 1 << 20  # bytes/s: an upload slower than this on average is taken for a stalled store


def bound(fs, nbytes: int = 0) -> dict:
    """A hard limit on one call's duration, as a keyword of fsspec's async filesystems: twice the timeout,
    plus the time to move `nbytes` at MIN_RATE. The connection's own read timeout should fire first,
    but aiohttp does not always start it on a request with a body (a PUT to a store that stopped
    answering was seen to wait for the store, not for the timeout); this limit always holds."""
    if not getattr(fs, "async_impl", False):
        return {}
    return {"timeout": 2 * policy().timeout + nbytes / MIN_RATE}


def forget_filesystems() -> None:
    """Drop this process's filesystems (a test that starts another local store, or new credentials)."""
    with _FS_LOCK:
        _FS.clear()
    from shardkit.store import objstore

    objstore.forget()


def client(url: str):
    """(filesystem, path) for a call of the hot paths: obstore's client where it serves `url`
    (store.objstore), else the fsspec filesystem."""
    from shardkit.store import objstore

    if objstore.serves(url):
        fs = objstore.Client(url, policy().timeout, lambda: filesystem(url)[0])
        return fs, fs._strip_protocol(url)
    return filesystem(url)


def _s3_session():
    """An aiobotocore session whose responses parse timestamps with the standard library: botocore's
    default (dateutil) spent 0.5 ms on each object's LastModified (80% of the client's time listing a
    folder, and ~1 ms of every GET's Last-Modified header); the values are the same datetimes."""
    from aiobotocore.session import AioSession

    session = AioSession()
    session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=_timestamp)
    return session


def _timestamp(value):
    from datetime import datetime

    try:
        return datetime.fromisoformat(value)  # ListObjectsV2's 2024-01-01T00:00:00.000Z
    except (TypeError, ValueError):
        pass
    try:
        from email.utils import parsedate_to_datetime

        return parsedate_to_datetime(value)  # a Last-Modified header: Wed, 21 Oct 2015 07:28:00 GMT
    except (TypeError, ValueError):
        from botocore.utils import parse_timestamp

        return parse_timestamp(value)  # anything else botocore reads (epoch numbers)


def retry(url: str, attempt, *, write: bool = False):
    """attempt() with the policy's retries (fs.with_retries); the RemoteError when it cannot pass names
    `url`, whether it was read or written, and the job's own options for a slower store."""
    try:
        return with_retries(url, policy(), attempt)
    except RemoteError as e:
        if not write and _READER_FIX not in e.detail:
            raise
        error = WriteError if write else RemoteError
        raise error(url, e.detail.replace(_READER_FIX, _STATE["fix"]), e.not_found) from e.__cause__


def _call(url: str, attempt, *, write: bool = False):
    """attempt(fs, path) with retry(): the client of `url` (see client) and its path there."""
    fs, path = client(url)
    return retry(url, lambda: attempt(fs, path), write=write)
