"""The calls of the offline jobs to a store: the filesystem of remote.filesystem with the job's
RemotePolicy, every call retried by remote.with_retries, errors naming the URL and what was written."""

from __future__ import annotations

from shardkit.store.remote import RemoteError, RemotePolicy, filesystem as _filesystem, with_retries

_STATE = {"policy": RemotePolicy(), "fix": "shardkit build --timeout/--retries"}
_READER_FIX = "StreamingDataset(timeout=..., retries=...)"  # what remote.with_retries names as the fix


def use_policy(p: RemotePolicy | None, fix: str = "shardkit build --timeout/--retries") -> None:
    """The waits and retries of this process's store calls (a job sets its own; its tasks set the
    job's), and the options a user changes to allow a slower store (named in errors)."""
    _STATE["policy"], _STATE["fix"] = p or RemotePolicy(), fix


def policy() -> RemotePolicy:
    return _STATE["policy"]


class WriteError(RemoteError):
    """A file could not be written to a store: `detail` says why and what was tried."""

    def __init__(self, url: str, detail: str, not_found: bool = False):
        super().__init__(url, detail, not_found)
        self.args = (f"cannot write {url}: {detail}",)


MIN_RATE = 1 << 20  # bytes/s: an upload slower than this on average is taken for a stalled store


def filesystem(url: str):
    """(fsspec filesystem, path) of `url` with this process's policy (remote.filesystem)."""
    return _filesystem(url, policy())


def bound(fs, nbytes: int = 0) -> dict:
    """A hard limit on one call's duration, as a keyword of fsspec's async filesystems: twice the timeout,
    plus the time to move `nbytes` at MIN_RATE. The connection's own read timeout should fire first,
    but aiohttp does not always start it on a request with a body (a PUT to a store that stopped
    answering was seen to wait for the store, not for the timeout); this limit always holds."""
    if not getattr(fs, "async_impl", False):
        return {}
    return {"timeout": 2 * policy().timeout + nbytes / MIN_RATE}


def client(url: str):
    """(filesystem, path) for a call of the hot paths: obstore's client where it serves `url`
    (store.objstore), else the fsspec filesystem."""
    from shardkit.store import objstore

    if objstore.serves(url):
        fs = objstore.Client(url, policy().timeout, lambda: filesystem(url)[0])
        return fs, fs._strip_protocol(url)
    return filesystem(url)


def retry(url: str, attempt, *, write: bool = False):
    """attempt() with the policy's retries (remote.with_retries); the RemoteError when it cannot pass names
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
