"""Listing a store one page at a time: every object below SRC for the walk (Keys), a folder's
files for the clean-up of OUT (list_folder).

fsspec's `ls` keeps a whole folder's listing as a dict per object, twice (its answer and its
cache): a folder of 10^6 objects would cost the client ~1 GB. Here S3 is read a page of 1,000
objects at a time, each page retried alone, and only the caller keeps what it needs. Keys reads
S3 as one stream in key order (no request per folder), through obstore where it serves (~5 µs of
client CPU per object against ~43 through s3fs's pages: bench/listing_cpu_bench.py). A long listing
of S3 for the walk goes on as a stream per folder, several at once, merged back in key order
(_Parallel: ~4x as fast over 50 ms pages, bench/listing_parallel_bench.py).
"""

from __future__ import annotations

import hashlib
import heapq
import queue
import threading
from collections import deque
from typing import Iterator, NamedTuple

from shardkit.store.remote import RemoteError, RemotePolicy
from shardkit.store.calls import bound, filesystem, lean, retry

PAGE = 1000  # objects per listing request (S3's maximum)
# A long listing of S3 (Keys(parallel=True), the walk of SRC) goes on as one stream per folder,
# PARALLEL at once, once one stream has given SWITCH pages (a small SRC stays one stream, and makes
# no s3fs); each folder's stream holds at most QUEUE pages ahead of the consumer.
PARALLEL = 64
SWITCH = 8
QUEUE = 2
DEPTH = 3  # levels a listing goes down to find folders to list in parallel (`train/00000/...`)
# Keys a folder must hold, on average over those the first SWITCH pages met, for a stream each to
# pay: a folder's stream costs a request and a thread, the one stream ~1/1,000 of a request a key.
FOLDER_KEYS = 100
LAST = "\U0010ffff"  # the last code point: a folder's prefix + LAST sorts after every key below it


class Entry(NamedTuple):
    """One name in a folder: a file (size, version: its ETag or mtime) or a subfolder."""

    name: str
    is_dir: bool
    size: int
    version: str


def version_number(version: str) -> int:
    """A file's version as the signed 64-bit number the walk records (its part of the rerun stamp)."""
    return int.from_bytes(hashlib.blake2b(version.encode(), digest_size=8).digest(), "little", signed=True)


def list_folder(url: str, policy: RemotePolicy | None = None) -> Iterator[Entry]:
    """The files and subfolders directly in `url`, in name order (a subfolder sorts as `name/`, as S3
    orders keys), page by page on S3; nothing when the folder does not exist."""
    if lean(url, policy):
        yield from _keys_folder(url, policy)
        return
    fs, path = filesystem(url, policy)
    if _pages_s3(fs):
        yield from _s3_folder(fs, url, path, policy)
        return
    yield from _fsspec_folder(fs, url, path, policy)


def _keys_folder(url: str, policy: RemotePolicy | None) -> Iterator[Entry]:
    """On obstore (no delimiter there): the folder's one stream of keys (Keys), each subfolder one
    entry and then passed over."""
    keys = Keys(url, policy)
    for rel, size, version in keys:
        name, below, _ = rel.partition("/")
        if below:
            yield Entry(name, True, 0, "")
            keys.skip(name + "/")
        else:
            yield Entry(rel, False, size, version)


S3_CALL = "_call_s3"  # s3fs's private request call: see _pages_s3


def _pages_s3(fs) -> bool:
    """Whether to list through s3fs's private `_call_s3` (ListObjectsV2 a page at a time, MaxKeys as
    asked); without it (another s3fs), fsspec's public listing of the folder serves, all at once."""
    return type(fs).__name__ == "S3FileSystem" and callable(getattr(fs, S3_CALL, None))


def _list_objects(fs, policy: RemotePolicy | None, **args) -> dict:
    """One ListObjectsV2 answer through s3fs's private `_call_s3` (its one caller), its wait bounded."""
    from fsspec.asyn import sync

    return sync(fs.loop, getattr(fs, S3_CALL), "list_objects_v2", **args, **bound(fs, 0, policy))


def _bucket_prefix(path: str) -> tuple[str, str]:
    """(bucket, the key prefix of the folder: '' or ending in '/') of an s3fs path."""
    bucket, _, key = path.partition("/")
    return bucket, key.strip("/") + "/" if key.strip("/") else ""


def _version(content: dict) -> str:
    """An object's version as a listing gives it: its ETag, else its mtime."""
    return str(content.get("ETag", content.get("LastModified", "")))


def _delimited(fs, url: str, bucket: str, prefix: str, policy: RemotePolicy | None, start: str | None = None):
    """s3fs's ListObjectsV2 answers for the folder `prefix` with a delimiter (its files, and its
    subfolders as CommonPrefixes), PAGE names at a time after the key `start`, each retried alone."""
    args = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/", "MaxKeys": PAGE}
    if start is not None:
        args["StartAfter"] = start
    while True:
        page = retry(url, lambda: _list_objects(fs, policy, **args), policy=policy)
        yield page
        if not page.get("IsTruncated"):
            return
        args["ContinuationToken"] = page["NextContinuationToken"]


def _s3_folder(fs, url: str, path: str, policy: RemotePolicy | None) -> Iterator[Entry]:
    bucket, prefix = _bucket_prefix(path)
    for page in _delimited(fs, url, bucket, prefix, policy):
        dirs = [Entry(p["Prefix"][len(prefix):-1], True, 0, "") for p in page.get("CommonPrefixes", [])]
        files = [Entry(c["Key"][len(prefix):], False, int(c["Size"]), _version(c))
                 for c in page.get("Contents", []) if len(c["Key"]) > len(prefix)]
        yield from heapq.merge(dirs, files, key=lambda e: e.name + "/" if e.is_dir else e.name)


def _fsspec_folder(fs, url: str, path: str, policy: RemotePolicy | None) -> Iterator[Entry]:
    """Any other fsspec store: one `ls` per folder (its cache dropped at once)."""
    try:
        infos = retry(url, lambda: fs.ls(path, detail=True), policy=policy)
    except RemoteError as e:
        if e.not_found:
            return
        raise
    finally:
        fs.invalidate_cache(path)
    entries = []
    for info in infos:
        name = info["name"].rstrip("/").rsplit("/", 1)[-1]
        if info["name"].rstrip("/") == path.rstrip("/"):
            continue
        is_dir = info.get("type") == "directory"
        version = str(info.get("ETag") or info.get("etag") or info.get("md5") or info.get("mtime")
                      or info.get("LastModified") or info.get("last_modified") or "")
        entries.append(Entry(name, is_dir, int(info.get("size") or 0), version))
    entries.sort(key=lambda e: e.name + "/" if e.is_dir else e.name)
    yield from entries


def has_any(url: str, policy: RemotePolicy | None = None) -> bool:
    """Whether anything lies at or below `url` (a file, or a folder holding one; a key that only
    shares the prefix, 'raw2/x' for 'raw', is not): one small listing of the folder, and for a URL
    without a trailing '/' and nothing below it, one request for the object itself."""
    from shardkit.store import objstore

    if lean(url, policy):
        key, seconds = url.split("://", 1)[1].partition("/")[2], _timeout(policy)

        def probe() -> bool | None:
            try:
                if next(objstore.list_pages(url, None, seconds), None) is not None:
                    return True
            except objstore.UnnamedKey:  # a key in the first page object_store cannot name: fsspec's below
                return None
            return bool(key.strip("/")) and not url.endswith("/") and objstore.is_object(url, seconds)

        found = retry(url, probe, policy=policy)
        if found is not None:
            return found
    fs, path = filesystem(url, policy)
    if _pages_s3(fs):
        bucket, folder = _bucket_prefix(path)

        def first(prefix: str) -> str | None:  # the first key that starts with `prefix`
            page = retry(url, lambda: _list_objects(fs, policy, Bucket=bucket, Prefix=prefix, MaxKeys=1),
                         policy=policy)
            return (page.get("Contents") or [{}])[0].get("Key")

        if first(folder) is not None:
            return True  # a key below the folder ('raw2/x' is not below 'raw')
        key = path.partition("/")[2]
        return bool(folder) and not url.endswith("/") and first(key) == key  # the object itself
    return bool(retry(url, lambda: fs.exists(path), policy=policy))


class Keys:
    """Every object below the folder `url`, in S3's key order (the UTF-8 bytes, which is Python's
    str order), as (relative key, size, version): one stream of pages on S3 (obstore's, else s3fs's
    ListObjectsV2 without a delimiter), a walk of list_folder's folders on any other store. A key
    ends in '/' where the store holds one (a folder marker), on both clients. The consumer may call
    skip(prefix) for a folder it will not read: the stream moves past it (a new request from the key
    after it, where the folder runs past the page in hand). A page that fails is retried alone,
    from the key after the last one given (the store's own key: the resume point)."""

    def __init__(self, url: str, policy: RemotePolicy | None = None, parallel: bool = False):
        self.url, self.policy, self.parallel = url.rstrip("/"), policy, parallel
        self.folder = self.url.split("://", 1)[1].partition("/")[2]  # bucket-relative, '' at the root
        self.after: str | None = None  # the stream continues with the keys after this one (relative)
        self._skip: str | None = None  # a folder being skipped: its keys left in the page are dropped
        self.own_marker = False  # whether the listing held the folder's own marker (`folder/`), left out
        self.marker_size, self.marker_version = 0, ""  # that marker's size and version
        self.stop: threading.Event | None = None  # set: the next page is not asked for (_Stream.close)

    def skip(self, folder: str) -> None:
        """Pass over every key below `folder` (relative, ending in '/')."""
        self._skip, self.after = folder, folder + LAST

    def __iter__(self) -> Iterator[tuple[str, int, str]]:
        if lean(self.url, self.policy):
            opener = self._obstore_pages
        else:
            fs, path = filesystem(self.url, self.policy)
            if not _pages_s3(fs):
                yield from self._folders()
                return
            opener = lambda after: self._s3_pages(fs, path, after)  # noqa: E731
        if not (self.parallel and self.url.startswith("s3://")):
            yield from self._paged(opener)
            return
        spread = _Spread()
        if not (yield from self._paged(opener, SWITCH, spread)):
            return
        if spread.worth():
            fs, path = filesystem(self.url, self.policy)
            if _pages_s3(fs):  # the folders come from s3fs's pages with a delimiter
                yield from _Parallel(self, opener, fs, path)
                return
        yield from self._paged(opener)

    def _paged(self, opener, most: int | None = None, spread: "_Spread | None" = None):
        """The stream's keys from the key after `after`; with `most`: at most that many pages, and
        then True (the stream may go on), else False; `spread` counts the folders they fall in."""
        pages, n = None, 0

        def next_page():
            nonlocal pages
            if self.stop is not None and self.stop.is_set():
                raise _Stopped
            if pages is None:
                pages = opener(self.after)
            try:
                return next(pages, None)
            except BaseException:
                pages = None  # the next try starts a new stream after the last key given
                raise

        while (page := retry(self.url, next_page, policy=self.policy)) is not None:
            n += 1
            for rel, size, version in page:
                if self._filtered(rel):
                    continue
                self.after = rel
                if spread is not None:
                    spread.add(rel)
                yield rel, size, version
            if self._skip is not None:  # the skipped folder may run on past this page: ask after it
                pages = None
            if most is not None and n >= most:
                return True
        return False

    def _filtered(self, rel: str) -> bool:
        """Whether `rel` lies in the folder being skipped (the skip ends at the first key past it)."""
        if self._skip is not None:
            if rel.startswith(self._skip):
                self.after = max(self.after, rel)  # keys may sort after the folder + LAST
                return True
            self._skip = None
        return False

    def _obstore_pages(self, after: str | None):
        """obstore's pages, their folder markers told apart (_markers). Where obstore cannot name a
        key ('a//b', 'a/./b') or start after one (a marker's 'a/'), a page of s3fs's."""
        from shardkit.store import objstore

        fs, last = None, after  # a restart compares with the key given last, as the stream before it did
        while True:
            if after is None or _nameable(after):
                try:
                    for page in objstore.list_pages(self.url, self._key(after), _timeout(self.policy)):
                        page = self._markers(page, last)
                        if page:
                            after = last = page[-1][0]
                            yield page
                    return
                except objstore.UnnamedKey:
                    pass
            if fs is None:
                fs, path = filesystem(self.url, self.policy)
            page, more, after = next(self._s3_pages(fs, path, after, pages=1))
            if page:
                last = page[-1][0]
                yield page
            if not more:
                return

    def _markers(self, page: list, last: str | None) -> list:
        """obstore's keys relative, with the '/' object_store drops from a folder marker put back:
        an empty object is a marker where it sorts before the key given before it (`a/` comes after
        `a-b/x` and `a.jpg`), else where a HEAD of its name finds nothing (one HEAD per empty object,
        none for the others). SRC's own marker is left out, as s3fs's pages leave it out. A marker
        with a body (not what consoles and tools write) reads as a file here."""
        from shardkit.store import objstore

        out, n = [], len(self.folder) + 1 if self.folder else 0
        for key, size, version in page:
            if key == self.folder:
                self.own_marker, self.marker_size, self.marker_version = True, size, version
                continue
            rel = key[n:]
            if size == 0 and ((last is not None and rel <= last)
                              or not objstore.is_object(f"{self.url}/{rel}", _timeout(self.policy))):
                rel += "/"
            out.append((rel, size, version))
            last = rel
        return out

    def _key(self, rel: str | None) -> str | None:
        """A relative key as obstore's offset (bucket-relative)."""
        if rel is None:
            return None
        return f"{self.folder}/{rel}" if self.folder else rel

    def _s3_pages(self, fs, path: str, after: str | None, pages: int | None = None):
        """s3fs's ListObjectsV2 pages, no delimiter; with `pages`, (page, whether more follow, the
        key to go on after: the answer's last, SRC's own marker included) that many times."""
        bucket, prefix = _bucket_prefix(path)
        args = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": PAGE}
        if after is not None:
            args["StartAfter"] = prefix + after
        while True:
            answer = _list_objects(fs, self.policy, **args)
            page = [(c["Key"][len(prefix):], int(c["Size"]), _version(c))
                    for c in answer.get("Contents", []) if len(c["Key"]) > len(prefix)]
            for c in answer.get("Contents", [])[:1]:
                if len(c["Key"]) == len(prefix):
                    self.own_marker, self.marker_size, self.marker_version = True, int(c["Size"]), _version(c)
            more = bool(answer.get("IsTruncated"))
            if pages is not None:
                contents = answer.get("Contents", [])  # none but more: no progress to make, taken as the end
                yield page, more and bool(contents), contents[-1]["Key"][len(prefix):] if contents else after
                pages -= 1
                if not pages:
                    return
            elif page:
                yield page
            if not more:
                return
            args["ContinuationToken"] = answer["NextContinuationToken"]

    def _folders(self) -> Iterator[tuple[str, int, str]]:
        """Any other fsspec store: list_folder's folders, a subfolder's keys in place (its name
        sorts as `name/`), which is the key order."""
        stack = [("", list_folder(self.url, self.policy))]
        while stack:
            folder, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                continue
            rel = folder + entry.name
            if entry.is_dir:
                stack.append((rel + "/", list_folder(f"{self.url}/{rel}", self.policy)))
                continue
            yield rel, entry.size, entry.version
            if self._skip is not None:
                while stack[-1][0].startswith(self._skip):
                    stack.pop()
                self._skip = None


class _Parallel:
    """The rest of a long listing of S3 (Keys(parallel=True)), from the key after `keys.after`, as one
    stream per folder, PARALLEL at once, merged back in key order: the keys the one stream would
    give, in its order, each folder's marker included. The folders come from listings with a
    delimiter (s3fs's ListObjectsV2 pages; object_store's reads a whole level before it answers),
    in key order with the files between them; a level of fewer than 2 folders is gone down into
    (DEPTH levels at most), so that `train/00000/...` is listed by its thousand folders. The folder
    of the last key given is listed on from that key. A skip() of a folder listed so drops its
    stream; a folder inside one is filtered out of it. A folder whose name cannot be a prefix of its
    own ('', '.', '..', or a character a URL reads: %, ?, #) ends it: the rest is one stream again.
    A folder's marker comes as 'a/' (a marker with a body, which consoles and tools do not write,
    reads as a file 'a' where obstore's one stream reads it)."""

    def __init__(self, keys: Keys, opener, fs, path: str):
        self.keys, self.opener, self.fs, self.path = keys, opener, fs, path

    def __iter__(self) -> Iterator[tuple[str, int, str]]:
        keys, units, ahead, streams = self.keys, self._units("", self.keys.after, 0), deque(), 0
        try:
            while True:
                while streams < PARALLEL and len(ahead) < PARALLEL + PAGE and (unit := next(units, None)):
                    if unit[0] == "folder":
                        unit, streams = ("stream", unit[1], _Stream(self, unit[1], unit[2])), streams + 1
                    ahead.append(unit)
                if not ahead:
                    return
                kind, rel, *rest = unit = ahead.popleft()
                streams -= kind == "stream"
                if kind == "odd":
                    ahead.appendleft(unit)
                    _close(ahead)
                    ahead.clear()
                    yield from keys._paged(self.opener)
                    return
                if keys._skip is not None and rel.startswith(keys._skip):  # inside a folder skipped
                    _close([unit])
                elif kind == "file":
                    keys.after = rel
                    yield rel, *rest
                else:
                    yield from self._drain(rel, rest[0])
        finally:
            _close(ahead)

    def _drain(self, folder: str, stream: "_Stream") -> Iterator[tuple[str, int, str]]:
        keys = self.keys
        try:
            for chunk in stream:
                for rel, size, version in chunk:
                    if keys._filtered(rel):
                        continue
                    keys.after = rel
                    yield rel, size, version
                    if keys._skip is not None:  # skip() called on this key
                        if folder.startswith(keys._skip):  # the whole folder
                            return
                        if keys._skip.startswith(folder):  # a folder in it: its stream moves past it
                            stream.skip(keys._skip[len(folder):])
        finally:
            stream.close()

    def _units(self, level: str, after: str | None, depth: int):
        """The units of `level` (relative, '' or ending in '/') after the key `after`, in key order:
        ('file', rel, size, version), ('folder', rel, the key to list it from or None) and ('odd',
        rel). A level of fewer than 2 folders on one page is gone down into, to DEPTH; one of pages
        of files and a folder at most is one stream (its files would come a page at a time anyway,
        and obstore's stream costs less than a page with a delimiter)."""
        head = None
        if after is not None and "/" in after[len(level):]:  # the folder of `after`: listed on from it
            head = level + after[len(level):].split("/", 1)[0] + "/"
            if _odd(level, head):
                yield "odd", head
                return
        pages = (([u for u in units if u[1] != head], more) for units, more in  # a key past head + LAST
                 self._level(level, head + LAST if head else after))  # ('a/\U0010ffffx') names it again
        first, more = next(pages, ([], False))
        folders = [u for u in first if u[0] == "folder"] + ([head] if head else [])
        if more and len(folders) < 2:
            yield ("folder", level, after) if level else ("odd", level)  # SRC's own rest: its one stream
            return
        if not more and len(folders) < 2 and depth < DEPTH:
            if head:
                yield from self._units(head, after, depth + 1)
            for unit in first:
                yield from self._units(unit[1], None, depth + 1) if unit[0] == "folder" else (unit,)
            return
        if head:
            yield "folder", head, after
        yield from first
        for page, _ in pages:
            yield from page

    def _level(self, level: str, start: str | None):
        """(units, whether more pages follow) of the folder `level`'s pages after the key `start`,
        through a listing with a delimiter: its files (the folder's own marker among them, as the
        one stream gives it), and its subfolders."""
        bucket, prefix = _bucket_prefix(self.path)
        for page in _delimited(self.fs, self.keys.url, bucket, prefix + level, self.keys.policy,
                               None if start is None else prefix + start):
            units = []
            for c in page.get("Contents", []):
                rel = c["Key"][len(prefix):]
                if rel:  # SRC's own marker: left out, as the one stream leaves it
                    units.append(("file", rel, int(c["Size"]), _version(c)))
            for p in page.get("CommonPrefixes", []):
                rel = p["Prefix"][len(prefix):]
                units.append(("odd", rel) if _odd(level, rel) else ("folder", rel, None))
            units.sort(key=lambda u: u[1])
            yield units, bool(page.get("IsTruncated"))


class _Spread:
    """How the keys a listing has given fall into folders, for each depth 1 to DEPTH + 1: the keys
    below a folder of that depth and how many such folders (keys come sorted: a folder is counted
    where a key leaves the one before)."""

    def __init__(self):
        self.last: list = [None] * (DEPTH + 1)
        self.keys, self.folders = [0] * (DEPTH + 1), [0] * (DEPTH + 1)

    def add(self, rel: str) -> None:
        parts = rel.split("/")[:-1]
        for d in range(min(len(parts), DEPTH + 1)):
            prefix = "/".join(parts[:d + 1])
            self.keys[d] += 1
            if prefix != self.last[d]:
                self.folders[d], self.last[d] = self.folders[d] + 1, prefix

    def worth(self) -> bool:
        """Whether a stream per folder pays: at the shallowest depth where the keys fall in 2 folders
        or more, FOLDER_KEYS or more a folder; where they all fall in one folder, it is a large one
        (SWITCH pages of it); none in a folder (a flat SRC): no."""
        for d in range(DEPTH + 1):
            if self.folders[d] >= 2:
                return self.keys[d] >= FOLDER_KEYS * self.folders[d]
        return self.folders[0] == 1


def _odd(level: str, folder: str) -> bool:
    """Whether the subfolder `folder` of `level` cannot be listed as a prefix of its own: its name is
    empty, '.' or '..', or holds a character a URL reads (%, ?, #)."""
    return folder[len(level):-1] in ("", ".", "..") or any(ch in folder for ch in "%?#")


class _Stream:
    """One folder's keys (a Keys of its own, from the key `after` or from the start, its own marker
    first), listed in a thread a few pages (QUEUE) ahead of the merge."""

    END = object()

    def __init__(self, parallel: _Parallel, folder: str, after: str | None):
        keys = parallel.keys
        self.q: queue.Queue = queue.Queue(QUEUE)
        self.stop = threading.Event()
        self._skips: list[str] = []  # folders in it the merge skipped (relative to it), for the thread
        self._lock = threading.Lock()
        sub = Keys(f"{keys.url}/{folder[:-1]}", keys.policy)
        sub.stop = self.stop
        if after is not None:
            sub.after = after[len(folder):]
        threading.Thread(target=self._run, args=(sub, folder, after is None), daemon=True, name="shardkit-list").start()

    def _run(self, sub: Keys, folder: str, marker: bool) -> None:
        try:
            chunk: list = []
            for rel, size, version in sub:
                if marker and sub.own_marker:  # known once its first page is read: it sorts first
                    chunk.append((folder, sub.marker_size, sub.marker_version))
                marker = False
                chunk.append((folder + rel, size, version))
                if self._skips:
                    self._pass_over(sub)
                if len(chunk) >= PAGE:
                    self._put(chunk)
                    chunk = []
            if marker and sub.own_marker:
                chunk.append((folder, sub.marker_size, sub.marker_version))
            self._put(chunk)
            self._put(self.END)
        except _Stopped:
            return
        except BaseException as e:  # raised where the merge reaches this folder
            try:
                self._put(e)
            except _Stopped:
                return

    def skip(self, inner: str) -> None:
        """The merge skipped the folder `inner` of this one (relative, ending in '/'): the thread's
        listing moves past it, if it is still in it (its keys already listed are filtered by the merge)."""
        with self._lock:
            self._skips.append(inner)

    def _pass_over(self, sub: Keys) -> None:
        """In the thread, between two keys of `sub` (as the walk calls skip between keys)."""
        with self._lock:
            skips, self._skips = self._skips, []
        for inner in skips:
            if sub.after is not None and sub.after.startswith(inner):  # not past it yet
                sub.skip(inner)

    def _put(self, item) -> None:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stopped

    def __iter__(self):
        while (item := self.q.get()) is not self.END:
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self.stop.set()


class _Stopped(BaseException):
    """A folder's stream was closed: its thread ends (a BaseException: no retry takes it for a fault)."""


def _close(units) -> None:
    for unit in units:
        if unit[0] == "stream":
            unit[2].close()


def _nameable(key: str) -> bool:
    """Whether obstore can start a listing after this key: object_store's paths have no empty, '.' or
    '..' segment and no trailing '/'."""
    return not key.endswith("/") and all(part not in ("", ".", "..") for part in key.split("/"))


def _timeout(policy: RemotePolicy | None) -> float:
    return (policy or RemotePolicy()).timeout
