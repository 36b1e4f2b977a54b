"""File access through fsspec (bounded waits, retries, errors that name the URL), and atomic writes."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from shardkit.errors import ConfigError, FolderLocked, ShardkitError
from shardkit.http_ranges import RangeIgnored  # read_range raises it; callers catch it here
from shardkit.http_ranges import get as http_get

# Protocol -> the extra that installs its fsspec backend.
EXTRAS = {"http": "http", "https": "http", "s3": "s3", "s3a": "s3"}
# HTTP statuses that may pass on a later try (timeouts, throttling, server errors); other 4xx never do.
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, ImportError,
             ValueError, TypeError)
# Protocols whose bytes shardkit reads on its own connections (http_ranges), not through fsspec.
OWN_CLIENT = frozenset({"http", "https"})


@dataclass(frozen=True)
class RemotePolicy:
    """How long remote reads wait and how often they try again (StreamingDataset(timeout=, retries=)).

    With the defaults a store that accepts connections but never answers fails a shard after
    3 tries x 15 s + 1 + 2 s of backoff = 48 s; one that refuses connections, within seconds.
    """

    timeout: float = 15.0  # seconds to connect, and at most between two reads that return data
    retries: int = 2  # more tries after a failure that may pass: timeout, reset, HTTP 5xx/429
    backoff: float = 1.0  # seconds before the first retry, doubled for each one after it

    def __post_init__(self):
        if not isinstance(self.timeout, (int, float)) or isinstance(self.timeout, bool) or self.timeout <= 0:
            raise ConfigError(f"timeout={self.timeout!r}: expected seconds > 0 (StreamingDataset(timeout=...))")
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise ConfigError(f"retries={self.retries!r}: expected an integer >= 0 (StreamingDataset(retries=...))")


class RemoteError(ShardkitError):
    """A remote file could not be read: `detail` says why and what was tried."""

    def __init__(self, url: str, detail: str, not_found: bool = False):
        super().__init__(f"cannot read {url}: {detail}")
        self.url, self.detail, self.not_found = url, detail, not_found

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


def _storage_options(protocol: str, policy: RemotePolicy) -> dict:
    """fsspec options that bound every wait of one protocol's backend to policy.timeout."""
    t = policy.timeout
    if protocol in ("http", "https"):
        import aiohttp

        # No total limit: a large shard on a slow link is fine while bytes keep coming.
        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=t, sock_read=t)}}
    if protocol in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": t, "read_timeout": t, "retries": {"max_attempts": 1}}}
    return {}


def filesystem(url: str, policy: RemotePolicy | None = None):
    """(fsspec filesystem, path) for a remote URL, its waits bounded by `policy`."""
    protocol = url.split("://", 1)[0]
    try:
        import fsspec  # heavy: only when reading remote data

        return fsspec.core.url_to_fs(url, **_storage_options(protocol, policy or RemotePolicy()))
    except ImportError as e:
        extra = EXTRAS.get(protocol)
        how = f"pip install 'shardkit[{extra}]'" if extra else f"install the fsspec backend for {protocol}://"
        raise ConfigError(f"cannot read {url}: {protocol}:// needs a package that is not installed ({e}); "
                          f"{how}") from e


def _chain(error: BaseException | None):
    """The error, its cause, their causes (a few levels)."""
    for _ in range(8):
        if error is None:
            return
        yield error
        error = error.__cause__ or error.__context__


def _status(error: BaseException) -> int | None:
    """The HTTP status a store answered with (fsspec reports some as FileNotFoundError), if any.
    A body that broke off is no answer: aiohttp gives its ContentLengthError `code` 400, the
    status its own parser would have sent, not one the store sent."""
    for e in _chain(error):
        if _cut(e):
            return None
        status = getattr(e, "status", None) or getattr(e, "code", None)
        if isinstance(status, int):
            return status
    return None


class ShortBody(ConnectionError):
    """A body that ended before the bytes asked for (a connection cut mid-transfer): may pass."""


class DiskError(ShardkitError):
    """Writing into the local shard cache failed (a full disk, a quota, no permission): this
    machine's fault, never the store's; not retried."""

    FIXES = {"ENOSPC": "free space in {folder} or lower cache_limit (StreamingDataset(cache_limit=...)), or give "
                       "cache_dir (or $SHARDKIT_CACHE) a larger disk",
             "EDQUOT": "free space within your quota in {folder} or lower cache_limit (StreamingDataset(cache_limit=...))",
             "EROFS": "{folder} is on a read-only file system: give cache_dir (or $SHARDKIT_CACHE) a writable folder",
             "EACCES": "give this user write access to {folder}, or give cache_dir (or $SHARDKIT_CACHE) another folder"}

    def __init__(self, error: OSError, folder: str, url: str):
        import errno

        name = errno.errorcode.get(error.errno or 0, "")
        fix = self.FIXES.get("EACCES" if name == "EPERM" else name, "check the disk of {folder}").format(folder=folder)
        super().__init__(f"{error.strerror or error}: {fix} (while fetching {url} into the shard cache)")


def _cut(error: BaseException) -> bool:
    """A body that broke off mid-transfer (short, or cut by the connection): a fault that may pass."""
    if isinstance(error, (ShortBody, http.client.IncompleteRead)):
        return True
    aiohttp = sys.modules.get("aiohttp")  # only there when an http(s) store was read
    return aiohttp is not None and isinstance(error, (aiohttp.ClientPayloadError,
                                                      aiohttp.http_exceptions.HttpProcessingError))


def remote_hint(url: str, error: BaseException) -> str:
    """What fixes a failed remote read, when the cause is a known one ('' otherwise)."""
    text = f"{type(error).__name__} {error}".lower()
    if str(url).split("://", 1)[0] == "s3" and "credential" in text:
        return ("; give S3 credentials the usual way: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, or "
                "AWS_PROFILE naming a profile in ~/.aws/credentials (an S3-compatible server: AWS_ENDPOINT_URL)")
    return ""


def retryable(error: BaseException, url: str) -> bool:
    """The one classifier of remote errors: True for a fault of the store or the network that may
    pass on a later try (a timeout, a reset, a body cut short, HTTP 408/425/429/5xx); False for an
    answer a retry cannot change (404, 403, other 4xx, a missing backend or credentials)."""
    if any(_cut(e) for e in _chain(error)):
        return True
    status = _status(error)
    if status is not None:
        return status in RETRY_STATUS
    return not isinstance(error, PERMANENT + (ShardkitError,)) and not remote_hint(url, error)


def _reason(error: BaseException, policy: RemotePolicy, url: str) -> str:
    status = _status(error)
    if status is not None:
        from http import HTTPStatus

        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:  # a code the standard library does not name
            phrase = ""
        return f"HTTP {status} {phrase}".rstrip()
    if isinstance(error, TimeoutError):
        return f"no answer within the {policy.timeout:g} s timeout"
    cuts = [e for e in _chain(error) if _cut(e)]
    if cuts:  # the innermost says it best (aiohttp's outer error quotes it with its parser's "400")
        return f"the body broke off before its end ({getattr(cuts[-1], 'message', None) or cuts[-1]})"
    if isinstance(error, FileNotFoundError):  # fsspec's http backend says so for a 404 only
        return "HTTP 404 Not Found" if url.startswith(("http://", "https://")) else "not found"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def with_retries(url: str, policy: RemotePolicy, attempt):
    """attempt() until it succeeds, retrying failures that may pass with exponential backoff;
    else a RemoteError naming the URL, the reason and what was tried."""
    start, tries = time.monotonic(), 0
    while True:
        tries += 1
        try:
            return attempt()
        except (ConfigError, DiskError, RangeIgnored):  # ours, this machine's, or an answer to act on
            raise
        except Exception as e:
            retry = retryable(e, url)
            if retry and tries <= policy.retries:
                time.sleep(policy.backoff * 2 ** (tries - 1))
                continue
            reason = _reason(e, policy, url) + remote_hint(url, e)
            if retry:
                detail = (f"{reason} (tried {tries} time(s) over {time.monotonic() - start:.1f} s, timeout "
                          f"{policy.timeout:g} s: StreamingDataset(timeout=..., retries=...) allow a slower store; "
                          "else check that the store is up and reachable from here)")
            else:
                detail = f"{reason} (not retried: a retry cannot pass)"
            raise RemoteError(url, detail, not_found=_status(e) == 404 or isinstance(e, FileNotFoundError)) from e


def open_url(url: str, mode: str = "rb", policy: RemotePolicy | None = None):
    """Open a local path or any fsspec URL (http(s)://, s3:// with s3fs installed, ...), seekable."""
    if not is_remote(url):
        return open(local_path(url), mode)
    fs, path = filesystem(url, policy)
    return fs.open(path, mode)


def read_bytes(url: str, policy: RemotePolicy | None = None, nbytes: int | None = None) -> bytes:
    """All of a (small) file: a local path, or a URL read with `policy`'s timeouts and retries.
    `nbytes`: its size, as recorded; a shorter body (cut off) is retried."""
    if not is_remote(url):
        with open(local_path(url), "rb") as f:
            return f.read()
    policy = policy or RemotePolicy()
    read = _reader(url, policy)

    def get() -> bytes:
        data = read(0, None)
        if nbytes is not None and len(data) < nbytes:
            raise ShortBody(f"the body ended after {len(data)} of {nbytes} bytes")
        return data

    return with_retries(url, policy, get)


def read_range(url: str, start: int, end: int, policy: RemotePolicy | None = None, into=None):
    """Bytes [start, end) of a remote file, with `policy`'s timeouts and retries: the one GET of a
    byte range. A shorter body (cut off) is retried; a longer one means the store ignored Range
    (RangeIgnored, not retried: the caller reads the file whole). `into`: a writable buffer of
    end - start bytes the body is read into (no bytes object made), returned filled."""
    policy = policy or RemotePolicy()
    read = _reader(url, policy)

    def get():
        data = read(start, end, into)
        if len(data) < end - start:
            raise ShortBody(f"asked bytes {start}-{end - 1}, the body ended after {len(data)} bytes")
        if len(data) > end - start:
            raise RangeIgnored(f"asked bytes {start}-{end - 1}, got {len(data)} bytes")
        return data

    return with_retries(url, policy, get)


def _reader(url: str, policy: RemotePolicy):
    """read(start, end, into=None) -> bytes of `url` (end None: to its end; `into`: a buffer to read
    them into, returned as filled), without retries: shardkit's own client for http(s)
    (http_ranges), else fsspec's."""
    if url.split("://", 1)[0] in OWN_CLIENT:
        return lambda start, end, into=None: http_get(url, start, end, policy.timeout, into)
    from shardkit.store import objstore

    if objstore.serves(url):  # s3:// on obstore when installed: a tenth of s3fs's CPU per GET
        fs = objstore.Client(url, policy.timeout, lambda: filesystem(url, policy)[0])
        path = fs._strip_protocol(url)
    else:
        fs, path = filesystem(url, policy)

    def read(start, end, into=None):
        data = fs.cat_file(path) if not start and end is None else fs.cat_file(path, start=start, end=end)
        if into is None or len(data) != len(into):
            return data
        into[:] = data
        return into

    return read


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


LOCK_FILE = os.path.join(".shardkit", "lock")
_HELD: dict[str, list] = {}  # lock files this process holds -> [depth, command, since]


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
    os.makedirs(os.path.dirname(path), exist_ok=True)
    key = os.path.realpath(path)
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
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode("utf-8", "replace")
        os.close(fd)
        raise FolderLocked(f"{folder} is being written by {_holder(holder)}; wait for it to end or choose another "
                           f"output folder (the lock, {path}, is released when that process ends, even if killed)") from None
    since = time.strftime("%Y-%m-%d %H:%M:%S %z")
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                             "since": since}).encode())
    _HELD[key] = [1, command, since]
    try:
        yield
    finally:
        del _HELD[key]
        os.close(fd)


def _holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"`{h['command']}` (pid {h['pid']} on host {h['host']}, since {h['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process (it is starting: no details yet)"
