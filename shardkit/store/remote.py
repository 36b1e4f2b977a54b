"""Remote bytes: the RemotePolicy (bounded waits, retries with backoff), the one classifier of remote
errors, errors that name the URL, and the ranged and whole reads (http(s) on store/http_ranges.py)."""

from __future__ import annotations

import http.client
import os
import sys
import threading
import time
from dataclasses import dataclass

from shardkit.errors import BadURL, ConfigError, ShardkitError, redact
from shardkit.store.answers import chain, store_code
from shardkit.store.http_ranges import FLOOR_RATE, Stalled
from shardkit.store.http_ranges import RangeIgnored  # read_range raises it; callers catch it here
from shardkit.store.http_ranges import connect as http_connect
from shardkit.store.http_ranges import get as http_get
from shardkit.store.local import is_url, local_path

# Protocol -> the shardkit extra that installs its fsspec backend (others: the package fsspec names).
EXTRAS = {"http": "http", "https": "http", "s3": "s3", "s3a": "s3", "az": "azure", "abfs": "azure", "abfss": "azure",
          "gs": "gcs", "gcs": "gcs"}
# HTTP statuses that may pass on a later try (timeouts, throttling, server errors); other 4xx never do.
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, ImportError,
             ValueError, TypeError)
# A dataset at such a URL is read on shardkit's own connections (store/http_ranges.py): fsspec's
# client (aiohttp) is needed only for a large file from a server that ignores Range, and
# reader.download says so then. A build's SRC there is listed through fsspec's client: checked.
OWN_CLIENT = frozenset({"http", "https"})
READER_FIX = "StreamingDataset(timeout=..., retries=...)"
JOB_FIX = "shardkit build --timeout/--retries"
_FS: dict = {}  # (pid, protocol, timeout) -> fsspec filesystem
_FS_LOCK = threading.Lock()


@dataclass(frozen=True)
class RemotePolicy:
    """How long remote reads wait and how often they try again (StreamingDataset(timeout=, retries=)).

    With the defaults a store that accepts connections but never answers fails a shard after
    3 tries x 15 s + 1 + 2 s of backoff = 48 s; one that refuses connections, within seconds.
    """

    timeout: float = 15.0  # seconds to connect, and at most between two reads that return data
    retries: int = 2  # more tries after a failure that may pass: timeout, reset, HTTP 5xx/429
    backoff: float = 1.0  # seconds before the first retry, doubled for each one after it
    fix: str = READER_FIX  # the options that allow a slower store, named in errors (a job's: JOB_FIX)
    # A reader's calls: in a process that may fork DataLoader workers later (not a worker, and no
    # epoch read in it yet: store.objstore.reading_here), they leave obstore's runtime unstarted,
    # since a process forked after it started cannot use it and falls back to s3fs.
    forks: bool = False

    def __post_init__(self):
        if not isinstance(self.timeout, (int, float)) or isinstance(self.timeout, bool) or self.timeout <= 0:
            raise ConfigError(f"timeout={self.timeout!r}: expected seconds > 0 (StreamingDataset(timeout=...))")
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise ConfigError(f"retries={self.retries!r}: expected an integer >= 0 (StreamingDataset(retries=...))")


class RemoteError(ShardkitError):
    """A remote file could not be read: `detail` says why and what was tried."""

    def __init__(self, url: str, detail: str, not_found: bool = False):
        url, detail = redact(url), redact(detail)
        super().__init__(f"cannot read {url}: {detail}")
        self.url, self.detail, self.not_found = url, detail, not_found


def unusable(protocol: str, what: str, value: str, why: str) -> str:
    """The message of a BadURL for a protocol whose backend shardkit cannot use."""
    return (f"{what} {redact(value)!r}: {protocol}:// is not a store shardkit can use ({why}); copy the data to a "
            "local folder or an object store (s3://, gs://, az://, hf://), or read it over http(s)://")


def missing_backend(protocol: str, error: BaseException, what: str, value: str) -> BadURL:
    """The BadURL for a protocol whose fsspec backend does not import: the package to install."""
    from fsspec.registry import known_implementations

    extra = EXTRAS.get(protocol)
    if extra:
        how = f"pip install 'shardkit[{extra}]'"
    else:
        how = known_implementations.get(protocol, {}).get("err") or f"install the fsspec backend for {protocol}://"
    return BadURL(f"{what} {value!r}: {protocol}:// needs a package that is not installed ({error}); {how}")


def filesystem(url: str, policy: RemotePolicy | None = None):
    """(fsspec filesystem, path) of `url`, its waits bounded by `policy` (connect and read timeouts),
    and no retry loop of the backend's own (s3fs retries 5 times by default, botocore more), so
    `with_retries` is the only one. One filesystem per process, protocol and timeout."""
    p = policy or RemotePolicy()
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
            except (TypeError, ValueError) as e:  # a backend that cannot be made from a URL alone
                hint = remote_hint(url, e)  # or one that needs credentials (adlfs)
                if hint:
                    raise BadURL(f"URL {redact(url)!r}: {redact(str(e))}{hint}") from None
                raise BadURL(unusable(protocol, "URL", url, f"{type(e).__name__}: {e}")) from None
            if hasattr(fs, "retries"):
                fs.retries = 1
            _no_retries(fs)
            _FS[key] = fs
    return fs, strip_protocol(fs, url)


def strip_protocol(fs, url: str) -> str:
    """`url` as a path of `fs`: fsspec's private `_strip_protocol` (a bucket-relative path that fs's
    calls take), else the URL without its protocol (what it gives for s3, gcs and az)."""
    strip = getattr(fs, "_strip_protocol", None)
    return strip(url) if strip is not None else url.split("://", 1)[-1]


def _options(protocol: str, p: RemotePolicy) -> dict:
    if protocol in ("s3", "s3a"):
        # total_max_attempts counts the first request (1: botocore never retries); its older
        # max_attempts counts retries after it (1 there would be a hidden second try per call).
        return {"config_kwargs": {"connect_timeout": p.timeout, "read_timeout": p.timeout,
                                  "retries": {"total_max_attempts": 1}}, "session": _s3_session()}
    if protocol in ("az", "abfs", "abfss"):  # adlfs: the waits per operation (its retries: see _no_retries)
        return {"connection_timeout": p.timeout, "read_timeout": p.timeout}
    if protocol in ("gs", "gcs"):  # gcsfs: each request's connect and read waits (none on the whole)
        import aiohttp

        from shardkit.store.objstore import _gcs_emulator

        if _gcs_emulator():  # a local emulator: no gRPC lookup of the bucket's kind
            os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # (60 s each, unanswered there)

        return {"requests_timeout": aiohttp.ClientTimeout(total=None, sock_connect=p.timeout, sock_read=p.timeout)}
    if protocol in ("http", "https"):
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=p.timeout,
                                                                   sock_read=p.timeout)}}
    return {}


def _no_retries(fs) -> None:
    """Azure's SDK under adlfs retries each request 3 times, 15 s apart and more, before with_retries
    sees a failure: its policy is told to try once (adlfs takes no option for it). gcsfs wraps its
    request methods in a loop of 6 tries, 1 to 32 s apart, fixed when the class is made: this
    filesystem calls the methods it wraps. Where a subclass overrides one and calls the wrapped
    parent (gcsfs's ExtendedGcsFileSystem, its default class, does so for get_file's requests),
    that one keeps gcsfs's loop: a whole-file download through gcsfs (store.local_copy on the
    fsspec path) may take gcsfs's 6 tries (~31 s) before with_retries sees a failure."""
    import types

    policy = getattr(getattr(getattr(fs, "service_client", None), "_config", None), "retry_policy", None)
    if policy is not None and hasattr(policy, "total_retries"):
        policy.total_retries = 0
    if type(fs).__module__.startswith("gcsfs"):
        for name in ("_request", "_get_file_request", "_get_file_concurrent"):
            inner = getattr(getattr(type(fs), name, None), "__wrapped__", None)
            if inner is not None:
                setattr(fs, name, types.MethodType(inner, fs))


def forget_filesystems() -> None:
    """Drop this process's filesystems and object-store clients (a test that starts another local
    store, or new credentials)."""
    with _FS_LOCK:
        _FS.clear()
    from shardkit.store import objstore

    objstore.forget()


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


def _status(error: BaseException) -> int | None:
    """The HTTP status a store answered with (fsspec reports some as FileNotFoundError), if any.
    A body that broke off is no answer: aiohttp gives its ContentLengthError `code` 400, the
    status its own parser would have sent, not one the store sent."""
    for e in chain(error):
        if _cut(e):
            return None
        status = getattr(e, "status", None) or getattr(e, "code", None) or getattr(e, "status_code", None)
        if isinstance(status, int):  # status_code: Azure's SDK (adlfs)
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
    protocol = str(url).split("://", 1)[0]
    if protocol == "s3" and "credential" in text:
        return ("; give S3 credentials the usual way: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, or "
                "AWS_PROFILE naming a profile in ~/.aws/credentials (an S3-compatible server: AWS_ENDPOINT_URL)")
    if protocol in ("gs", "gcs") and (_status(error) in (401, 403) or any(
            word in text for word in ("credential", "token request", "service account", "defaultcredentials"))):
        return ("; give GCS credentials the usual way: GOOGLE_APPLICATION_CREDENTIALS naming a service account's "
                "key file, `gcloud auth application-default login`, or the metadata server of a Google Cloud machine "
                "(a local emulator: STORAGE_EMULATOR_HOST)")
    if protocol in ("az", "abfs", "abfss") and (_status(error) == 403 or isinstance(error, PermissionError) or any(
            word in text for word in ("credential", "missingaccount", "account must be", "account_name",
                                      "connection string", "connection_string"))):
        if os.environ.get("AZURE_STORAGE_CONNECTION_STRING") and _status(error) != 403:
            return ("; AZURE_STORAGE_CONNECTION_STRING names no account: it takes AccountName and AccountKey (or "
                    "SharedAccessSignature), and BlobEndpoint for a store elsewhere than Azure's cloud")
        return ("; give Azure credentials the usual way: AZURE_STORAGE_CONNECTION_STRING, or "
                "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or a service "
                "principal (AZURE_STORAGE_CLIENT_ID, AZURE_STORAGE_CLIENT_SECRET, AZURE_STORAGE_TENANT_ID)")
    return ""


def retryable(error: BaseException, url: str) -> bool:
    """The one classifier of remote errors: True for a fault of the store or the network that may
    pass on a later try (a timeout, a reset, a body cut short, HTTP 408/425/429/5xx); False for an
    answer a retry cannot change (404, 403, other 4xx, a missing backend or credentials)."""
    if any(_cut(e) for e in chain(error)):
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
        code = store_code(error)
        return f"HTTP {status} {phrase}".rstrip() + (f" ({code})" if code else "")
    if isinstance(error, Stalled):
        return str(error)
    if isinstance(error, TimeoutError):
        return f"no answer within the {policy.timeout:g} s timeout"
    cuts = [e for e in chain(error) if _cut(e)]
    if cuts:  # the innermost says it best (aiohttp's outer error quotes it with its parser's "400")
        return f"the body broke off before its end ({getattr(cuts[-1], 'message', None) or cuts[-1]})"
    if isinstance(error, FileNotFoundError):  # fsspec's http backend says so for a 404 only
        return "HTTP 404 Not Found" if url.startswith(("http://", "https://")) else "not found"
    text = str(error).strip().split("\n", 1)[0].split("<?xml", 1)[0].rstrip(" :")  # one line, no XML body
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


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
                          f"{policy.timeout:g} s: {policy.fix} allow a slower store; "
                          "else check that the store is up and reachable from here)")
            else:
                detail = f"{reason} (not retried: a retry cannot pass)"
            raise RemoteError(url, detail, not_found=_status(e) == 404 or isinstance(e, FileNotFoundError)) from e


def open_url(url: str, mode: str = "rb", policy: RemotePolicy | None = None):
    """Open a local path or any fsspec URL (http(s)://, s3:// with s3fs installed, ...), seekable."""
    if not is_url(url):
        return open(local_path(url), mode)
    fs, path = filesystem(url, policy)
    return fs.open(path, mode)


def read_bytes(url: str, policy: RemotePolicy | None = None, nbytes: int | None = None) -> bytes:
    """All of a (small) file: a local path, or a URL read with `policy`'s timeouts and retries.
    `nbytes`: its size, as recorded; a shorter body (cut off) is retried."""
    if not is_url(url):
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


def _own_client(url: str) -> bool:
    """Whether `url` is read with shardkit's own http(s) client (http_ranges)."""
    return url.split("://", 1)[0] in OWN_CLIENT


def opens_ahead(url: str) -> bool:
    """Whether `open_ahead` opens anything for `url`: shardkit's own http(s) client keeps one
    connection per thread and host; the object-store clients keep pools of their own."""
    return _own_client(url)


def open_ahead(url: str, policy: RemotePolicy | None = None) -> None:
    """This thread's connection to `url`'s host opened now (TCP and TLS) where `opens_ahead(url)`,
    so that its next GET there is one round trip; best effort (the GET reports what fails)."""
    if opens_ahead(url):
        http_connect(url, (policy or RemotePolicy()).timeout)


def refused_at_headers(url: str) -> bool:
    """Whether a ranged GET of `url` that the store answers with the whole file costs only that
    answer's headers (shardkit's own http client drops the connection unread: http_ranges), so that
    the parts of a file may all be asked at once without first finding out whether Range works
    (a probe of one round trip: 0.07 s before a fresh cache's first shard, traced on the bench)."""
    return _own_client(url)


def _reader(url: str, policy: RemotePolicy):
    """read(start, end, into=None) -> bytes of `url` (end None: to its end; `into`: a buffer to read
    them into, returned as filled), without retries: shardkit's own client for http(s)
    (http_ranges), else fsspec's."""
    if _own_client(url):
        return lambda start, end, into=None: http_get(url, start, end, policy.timeout, into)
    from shardkit.store import objstore

    if objstore.serves(url, forks=policy.forks):  # s3:// on obstore when installed: a tenth of s3fs's CPU per GET
        fs = objstore.Client(url, policy.timeout, lambda: filesystem(url, policy)[0])
        path = fs._strip_protocol(url)
    else:
        fs, path = filesystem(url, policy)

    def read(start, end, into=None):
        # An async backend (s3fs, ...) takes a limit on the whole call: its body has the time a
        # FLOOR_RATE body would take, plus the timeout (its socket bounds each read only).
        limit = {} if end is None or not getattr(fs, "async_impl", False) else {
            "timeout": 2 * policy.timeout + (end - (start or 0)) / FLOOR_RATE}
        if not start and end is None:
            data = fs.cat_file(path, **limit)
        else:
            data = fs.cat_file(path, start=start, end=end, **limit)
        if into is None or len(data) != len(into):
            return data
        into[:] = data
        return into

    return read


