"""SRC and OUT wherever they live: a local folder or an fsspec URL (s3://, gs://, az://, hf://, ...).

The offline jobs touch files through the few verbs here. Locally they are the os calls (atomic
writes: temp, then rename). On a store every call is bounded by a RemotePolicy (timeouts, retries
with backoff, an error that names the URL and the options to raise), passed as each verb's `policy`
(a job passes its own on every call; None: JOB_POLICY, the defaults of --timeout/--retries), and a
file is never visible half-written: one PUT (or one completed multipart upload) makes an object, so
what a marker or a manifest names is whole.

Files a job writes on a store are first written to a local staging folder (`staged`), by the very
writers a local build uses (same bytes, same checksums), then uploaded by the process that wrote
them (`publish`): shards go from the worker that made them straight to the store. Files a task
reads by memory map (row indexes, unit tables) come from a per-process cache (`local_copy`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile

from shardkit.store.remote import RemoteError, RemotePolicy, strip_protocol
from shardkit.store.local import atomic_write, fsync_path, local_path, tmp_name
from shardkit.store.calls import JOB_POLICY, _call, _policy, bound, filesystem, lean, retry
from shardkit.store.urls import BadURL, check_location
from shardkit.store.local import is_url, join

__all__ = ["BadURL", "check_location", "is_url", "join", "location", "JOB_POLICY", "retry",
           "read", "read_many", "write", "writer", "makedirs", "size", "exists", "listdir", "remove", "remove_tree",
           "staged", "publish", "local_copy", "drop_copy", "open_source", "read_source", "read_sources",
           "fetch_sources", "stat_source"]

UPLOAD_PART = 16 << 20  # bytes per multipart part: an upload holds UPLOAD_CONCURRENCY parts at most
UPLOAD_CONCURRENCY = 4


def location(value: str, what: str, *, write: bool = False) -> str:
    """A checked location (see check_location), made absolute when local."""
    checked = check_location(value, what, write=write)
    return checked if is_url(checked) else os.path.abspath(checked)


def check_source(src: str, policy: RemotePolicy | None = None) -> None:
    """SRC is there before anything is written to OUT: a local folder, or a store whose bucket answers
    (one small listing; a bucket that does not exist, or credentials it refuses, fail here)."""
    if not is_url(src):
        if not os.path.isdir(src):
            raise FileNotFoundError(f"source folder {src!r} does not exist or is not a folder")
        return
    from shardkit.store.listing import has_any

    has_any(src, policy)


def same_location(a: str, b: str) -> bool:
    """Whether two checked locations (see location) are one folder."""
    if is_url(a) or is_url(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _missing(error: BaseException) -> bool:
    return isinstance(error, FileNotFoundError) or (isinstance(error, RemoteError) and error.not_found)


# ------------------------------------------------------------------------------------------ small files

def read(url: str, policy: RemotePolicy | None = None) -> bytes:
    """All of a file; FileNotFoundError when there is none."""
    if not is_url(url):
        with open(local_path(url), "rb") as f:
            return f.read()
    try:
        return _call(url, lambda fs, path: fs.cat_file(path), policy=policy)
    except RemoteError as e:
        if e.not_found:
            raise FileNotFoundError(url) from e
        raise


def read_many(urls: list[str], policy: RemotePolicy | None = None) -> dict[str, bytes | None]:
    """Many small files at once (markers): on a store, requests run concurrently; None for a missing one."""
    if not urls:
        return {}
    if not is_url(urls[0]):
        out = {}
        for url in urls:
            try:
                out[url] = read(url, policy)
            except OSError:
                out[url] = None
        return out
    if lean(urls[0], policy):  # obstore's GETs in its pool's threads; a failed one read alone, retried
        got = dict(zip(urls, fetch_sources(urls, policy).result()))
    else:
        fs, _ = filesystem(urls[0], policy)
        paths = {strip_protocol(fs, u): u for u in urls}
        answers = retry(urls[0], lambda: fs.cat(list(paths), on_error="return"), policy=policy)
        got = {url: answers.get(path) for path, url in paths.items()}
    out = {}
    for url, value in got.items():
        if isinstance(value, BaseException) and not _missing(value):
            raise RemoteError(url, f"{type(value).__name__}: {value}")
        out[url] = value if isinstance(value, bytes) else None
    return out


def write(url: str, data: bytes | str, policy: RemotePolicy | None = None) -> None:
    """All of `data` into `url`, atomically (a reader sees the old file, the new one, or none)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not is_url(url):
        atomic_write(local_path(url), data)
        return
    _call(url, lambda fs, path: fs.pipe_file(path, data, **bound(fs, len(data), policy)), write=True, policy=policy)


def size(url: str, policy: RemotePolicy | None = None) -> int | None:
    """The file's size in bytes, None when there is no such file."""
    if not is_url(url):
        try:
            st = os.stat(local_path(url))
        except OSError:
            return None
        return st.st_size if os.path.isfile(local_path(url)) else None
    try:
        info = _call(url, lambda fs, path: fs.info(path, **bound(fs, 0, policy)), policy=policy)
    except (RemoteError, FileNotFoundError) as e:
        if _missing(e):
            return None
        raise
    return int(info["size"]) if info.get("type") == "file" else None


def exists(url: str, policy: RemotePolicy | None = None) -> bool:
    return size(url, policy) is not None


def listdir(url: str, policy: RemotePolicy | None = None) -> dict[str, int]:
    """{name: size} of the files directly in a folder ({} when it does not exist)."""
    if not is_url(url):
        folder = local_path(url)
        if not os.path.isdir(folder):
            return {}
        return {e.name: e.stat().st_size for e in os.scandir(folder) if e.is_file()}
    from shardkit.store.listing import list_folder

    return {e.name: e.size for e in list_folder(url, policy) if not e.is_dir}


def remove(url: str, policy: RemotePolicy | None = None) -> None:
    """Delete a file; one that is not there is fine."""
    if not is_url(url):
        with contextlib.suppress(FileNotFoundError):
            os.remove(local_path(url))
        return
    try:
        _call(url, lambda fs, path: fs.rm_file(path, **bound(fs, 0, policy)), write=True, verb="delete", policy=policy)
    except (RemoteError, FileNotFoundError) as e:
        if not _missing(e):
            raise


def remove_tree(url: str, policy: RemotePolicy | None = None) -> None:
    """Delete a folder and everything below it; one that is not there is fine."""
    if not is_url(url):
        import shutil

        shutil.rmtree(local_path(url), ignore_errors=True)
        return
    if lean(url, policy, write=True):
        _remove_keys(url, policy)
        return
    try:
        _call(url, lambda fs, path: fs.rm(path, recursive=True), write=True, verb="delete", policy=policy)
    except (RemoteError, FileNotFoundError) as e:
        if not _missing(e):
            raise


def _remove_keys(url: str, policy: RemotePolicy | None) -> None:
    """On obstore: the folder's keys, a page at a time, each page one bulk DELETE; a key object_store
    cannot name (a folder marker 'x/', 'a//b'), and the folder's own marker, one DELETE of fsspec's."""
    from shardkit.store import objstore
    from shardkit.store.listing import PAGE, Keys, _nameable

    page: list[str] = []

    def flush():
        def attempt():
            try:
                objstore.delete_many(url, page, _policy(policy).timeout)
            except objstore.BulkRefused:  # Azure refused the batch: one DELETE a key, through fsspec
                fs, path = filesystem(url, policy)  # (rm_file: fs.rm would read '[' or '*' in a key as a glob)
                for rel in page:
                    with contextlib.suppress(FileNotFoundError):  # gone already (a retry of this page)
                        fs.rm_file(f"{path.rstrip('/')}/{rel}")
        retry(url, attempt, write=True, verb="delete", policy=policy)
        page.clear()

    def one_by_fsspec(rel: str):
        fs, path = filesystem(url, policy)
        retry(url, lambda: fs.rm_file(f"{path.rstrip('/')}/{rel}"), write=True, verb="delete", policy=policy)

    keys = Keys(url, policy)
    try:
        for rel, _, _ in keys:
            if not _nameable(keys._key(rel)):  # the folder's own part too: obstore names the whole key
                one_by_fsspec(rel)
                continue
            page.append(rel)
            if len(page) == PAGE:
                flush()
        if page:
            flush()
        if keys.own_marker:
            one_by_fsspec("")
    except (RemoteError, FileNotFoundError) as e:
        if not _missing(e):
            raise


# ----------------------------------------------------------------------------- staged writes, cached reads

@contextlib.contextmanager
def writer(url: str, *, durable: bool = True, policy: RemotePolicy | None = None):
    """A binary file to write `url` through, atomically: temp then rename on a local disk (fsync unless
    `durable=False`); on a store, a local temp file uploaded on success (nothing appears otherwise)."""
    if not is_url(url):
        from shardkit.store.local import atomic_writer

        with atomic_writer(local_path(url), durable=durable) as f:
            yield f
        return
    tmp = tmp_name(os.path.join(_private_dir("stage"), url.rsplit("/", 1)[-1]))
    try:
        with open(tmp, "wb") as f:
            yield f
        _call(url, lambda fs, path: _upload(fs, tmp, path, policy), write=True, policy=policy)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def makedirs(url: str) -> None:
    """Create a local folder (and its parents); a store needs no folders."""
    if not is_url(url):
        os.makedirs(local_path(url), exist_ok=True)


def _private_dir(kind: str) -> str:
    """A folder of this user's under the temp dir (TMPDIR): staging and cache of a process."""
    folder = os.path.join(tempfile.gettempdir(), f"shardkit-{kind}-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def staged(out: str) -> str:
    """Where a writer puts the files of OUT: OUT itself when local; for a store, a local folder of
    this process (files there are uploaded by `publish`, then removed)."""
    if not is_url(out):
        return local_path(out)
    digest = hashlib.sha256(out.encode()).hexdigest()[:16]
    return os.path.join(_private_dir("stage"), f"{os.getpid()}-{digest}")


def publish(out: str, rel: str, *, durable: bool = True, policy: RemotePolicy | None = None) -> None:
    """Make OUT/rel, written under `staged(out)`, durable where it belongs: fsync on a local disk
    (unless the caller syncs), or an upload by this process (multipart past 2 parts, never more than
    UPLOAD_CONCURRENCY parts in memory) and the staged copy removed."""
    if not is_url(out):
        if durable:
            fsync_path(os.path.join(local_path(out), rel))
        return
    source, url = os.path.join(staged(out), rel), join(out, rel)
    _call(url, lambda fs, path: _upload(fs, source, path, policy), write=True, policy=policy)
    os.remove(source)


def _takes_parts(fs) -> bool:
    """Whether fs.put_file takes a part size and a concurrency (s3fs, the lean client; adlfs has a
    max_concurrency but no part size). The lean client is asked by its type: looking up any other
    name on it would build its fsspec fallback (s3fs, botocore: ~0.24 CPU-s a process) for nothing."""
    import inspect

    from shardkit.store import objstore

    if isinstance(fs, objstore.Client):
        return True
    put = getattr(fs, "_put_file", None)
    return put is not None and {"chunksize", "max_concurrency"} <= set(inspect.signature(put).parameters)


def _upload(fs, source: str, path: str, policy: RemotePolicy | None) -> None:
    if _takes_parts(fs):  # bounded part size and concurrency
        fs.put_file(source, path, chunksize=UPLOAD_PART, max_concurrency=UPLOAD_CONCURRENCY,
                    **bound(fs, os.path.getsize(source), policy))
    else:
        fs.put_file(source, path, **bound(fs, os.path.getsize(source), policy))


def _cached(url: str, version: str) -> str:
    name = hashlib.sha256(f"{url}|{version}".encode()).hexdigest()[:24] + "-" + url.rsplit("/", 1)[-1]
    return os.path.join(_private_dir("cache"), name)


def local_copy(url: str, version: str = "", policy: RemotePolicy | None = None) -> str:
    """A local path holding `url`'s bytes: the path itself when local; else a copy downloaded once per
    machine and user into the temp dir. Only for files whose name changes with their content (row
    indexes, sample tables), or with the `version` their content has (a shard's sha256): a cached
    copy is never stale."""
    if not is_url(url):
        return local_path(url)
    path = _cached(url, version)
    if os.path.exists(path):
        return path
    tmp = tmp_name(path)
    try:
        _call(url, lambda fs, remote: fs.get_file(remote, tmp), policy=policy)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
    return path


def drop_copy(url: str, version: str = "") -> None:
    """Forget the cached copy of `url`."""
    if is_url(url):
        with contextlib.suppress(FileNotFoundError):
            os.remove(_cached(url, version))


# --------------------------------------------------------------------------------------------- sources

def open_source(url: str, policy: RemotePolicy | None = None):
    """A source file's bytes, local or remote: a seekable binary file. On a store, opening waits at
    most the policy's timeout per try, and a read that fails in a way that may pass (a timeout, a
    reset, HTTP 5xx/429) reopens the file where it stopped, the policy's retries times; the
    RemoteError after that names the URL. The one way shardkit opens what SRC holds."""
    if not is_url(url):
        return open(local_path(url), "rb")
    from shardkit.store.source import ResumingFile

    return ResumingFile(url, policy)


def read_sources(urls: list[str], policy: RemotePolicy | None = None) -> list:
    """Many whole source files at once, in order: each one's bytes, or the exception reading it raised.
    On a store the requests run concurrently (a task reading its images one GET at a time waits one
    round trip per image); a file that failed is then read alone, with the policy's retries."""
    return fetch_sources(urls, policy).result()


def fetch_sources(urls: list[str], policy: RemotePolicy | None = None):
    """read_sources started in the background: its `.result()` is read_sources' list. On a store the
    requests go out now (obstore: threads of its pool; fsspec: its event loop), while the caller goes on (it works on the
    previous batch meanwhile); locally the files are read when the result is asked for."""
    from shardkit.store.source import Fetch

    return Fetch(urls, policy)


def stat_source(url: str, policy: RemotePolicy | None = None) -> tuple[int, int] | None:
    """(size, version) of a source file, None when there is none: the version is the mtime in ns
    locally, a number made from the ETag (or mtime) on a store."""
    if not is_url(url):
        try:
            st = os.stat(local_path(url))
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns
    try:
        info = _call(url, lambda fs, path: fs.info(path, **bound(fs, 0, policy)), policy=policy)
    except RemoteError as e:
        if e.not_found:
            return None
        raise
    from shardkit.store.listing import version_number

    version = str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or "")
    return int(info.get("size") or 0), version_number(version)


def read_source(url: str, start: int | None = None, end: int | None = None,
                policy: RemotePolicy | None = None) -> bytes:
    """Bytes [start, end) of a source file (all of it by default), with open_source's waits."""
    if not is_url(url):
        with open(local_path(url), "rb") as f:
            if start:
                f.seek(start)
            return f.read() if end is None else f.read(end - (start or 0))
    return _call(url, lambda fs, path: fs.cat_file(path, start=start, end=end), policy=policy)
