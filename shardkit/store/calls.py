"""The calls of the offline jobs to a store: the filesystem of remote.filesystem with the job's
RemotePolicy, every call retried by remote.with_retries, errors naming the URL and what was written.

The policy is an argument of every call: a job passes its own (config.remote_policy(cfg)) down every
path to the store, carried by its context objects (BuildContext, ScanOptions, MapContext, ...). None
is JOB_POLICY, a constant (the defaults of --timeout/--retries, whose errors name them), for a
library caller that passes nothing; there is no process-wide policy a job could set for another."""

from __future__ import annotations

from shardkit.store.remote import JOB_FIX, RemoteError, RemotePolicy, filesystem as _filesystem, with_retries

JOB_POLICY = RemotePolicy(fix=JOB_FIX)  # the defaults of --timeout/--retries


def _policy(p: RemotePolicy | None) -> RemotePolicy:
    return p if p is not None else JOB_POLICY


class WriteError(RemoteError):
    """A file could not be written to a store (or deleted there: `verb`): `detail` says why and what
    was tried."""

    def __init__(self, url: str, detail: str, not_found: bool = False, verb: str = "write"):
        super().__init__(url, detail, not_found)
        self.args = (f"cannot {verb} {self.url}: {self.detail}",)


MIN_RATE = 1 << 20  # bytes/s: an upload slower than this on average is taken for a stalled store


def filesystem(url: str, policy: RemotePolicy | None = None):
    """(fsspec filesystem, path) of `url` with `policy`'s waits (remote.filesystem)."""
    return _filesystem(url, _policy(policy))


def bound(fs, nbytes: int = 0, policy: RemotePolicy | None = None) -> dict:
    """A hard limit on one call's duration, as a keyword of fsspec's async filesystems: twice the timeout,
    plus the time to move `nbytes` at MIN_RATE. The connection's own read timeout should fire first,
    but aiohttp does not always start it on a request with a body (a PUT to a store that stopped
    answering was seen to wait for the store, not for the timeout); this limit always holds."""
    if not getattr(fs, "async_impl", False):
        return {}
    return {"timeout": 2 * _policy(policy).timeout + nbytes / MIN_RATE}


def lean(url: str, policy: RemotePolicy | None = None, *, write: bool = False) -> bool:
    """Whether obstore's client carries the calls on `url` made under `policy` (store.objstore.serves:
    a reader's policy, which forks, starts no runtime in a process that forks its workers later);
    `write`: a write's (gs:// is read on obstore, written through gcsfs: objstore.WRITES)."""
    from shardkit.store import objstore

    forks = policy is not None and policy.forks  # none given: JOB_POLICY, which does not fork
    return objstore.serves(url, forks=forks) and (not write or objstore.writes(url))


def client(url: str, policy: RemotePolicy | None = None):
    """(filesystem, path) for a call of the hot paths: obstore's client where it serves `url`
    (store.objstore), else the fsspec filesystem."""
    from shardkit.store import objstore

    if lean(url, policy):
        fs = objstore.Client(url, _policy(policy).timeout, lambda: filesystem(url, policy)[0])
        return fs, fs._strip_protocol(url)
    return filesystem(url, policy)


def retry(url: str, attempt, *, write: bool = False, verb: str = "write", policy: RemotePolicy | None = None):
    """attempt() with the policy's retries (remote.with_retries); the RemoteError when it cannot pass names
    `url`, whether it was read or written (`verb`: or deleted), and the policy's options for a slower
    store (its `fix`)."""
    try:
        return with_retries(url, _policy(policy), attempt)
    except RemoteError as e:
        if not write:
            raise
        raise WriteError(url, e.detail, e.not_found, verb) from e.__cause__


def _call(url: str, attempt, *, write: bool = False, verb: str = "write", policy: RemotePolicy | None = None):
    """attempt(fs, path) with retry(): the client of `url` (see client) and its path there."""
    fs, path = client(url, policy)
    return retry(url, lambda: attempt(fs, path), write=write, verb=verb, policy=policy)
