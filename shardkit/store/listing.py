"""Listing a store one page at a time: every object below SRC for the walk (Keys), a folder's
files for the clean-up of OUT (list_folder).

fsspec's `ls` keeps a whole folder's listing as a dict per object, twice (its answer and its
cache): a folder of 10^6 objects would cost the client ~1 GB. Here S3 is read a page of 1,000
objects at a time, each page retried alone, and only the caller keeps what it needs. Keys reads
S3 as one stream in key order (no request per folder), through obstore where it serves (~5 µs of
client CPU per object against ~43 through s3fs's pages: bench/listing_cpu_bench.py).
"""

from __future__ import annotations

import hashlib
import heapq
from typing import Iterator, NamedTuple

from shardkit.store.remote import RemoteError, RemotePolicy
from shardkit.store.calls import bound, filesystem, lean, retry

PAGE = 1000  # objects per listing request (S3's maximum)
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


def _s3_folder(fs, url: str, path: str, policy: RemotePolicy | None) -> Iterator[Entry]:
    bucket, prefix = _bucket_prefix(path)
    args = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/", "MaxKeys": PAGE}
    while True:
        page = retry(url, lambda: _list_objects(fs, policy, **args), policy=policy)
        dirs = [Entry(p["Prefix"][len(prefix):-1], True, 0, "") for p in page.get("CommonPrefixes", [])]
        files = [Entry(c["Key"][len(prefix):], False, int(c["Size"]), _version(c))
                 for c in page.get("Contents", []) if len(c["Key"]) > len(prefix)]
        yield from heapq.merge(dirs, files, key=lambda e: e.name + "/" if e.is_dir else e.name)
        if not page.get("IsTruncated"):
            return
        args["ContinuationToken"] = page["NextContinuationToken"]


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

    def __init__(self, url: str, policy: RemotePolicy | None = None):
        self.url, self.policy = url.rstrip("/"), policy
        self.folder = self.url.split("://", 1)[1].partition("/")[2]  # bucket-relative, '' at the root
        self.after: str | None = None  # the stream continues with the keys after this one (relative)
        self._skip: str | None = None  # a folder being skipped: its keys left in the page are dropped
        self.own_marker = False  # whether the listing held the folder's own marker (`folder/`), left out

    def skip(self, folder: str) -> None:
        """Pass over every key below `folder` (relative, ending in '/')."""
        self._skip, self.after = folder, folder + LAST

    def __iter__(self) -> Iterator[tuple[str, int, str]]:
        if lean(self.url, self.policy):
            yield from self._paged(self._obstore_pages)
            return
        fs, path = filesystem(self.url, self.policy)
        if _pages_s3(fs):
            yield from self._paged(lambda after: self._s3_pages(fs, path, after))
            return
        yield from self._folders()

    def _paged(self, opener) -> Iterator[tuple[str, int, str]]:
        pages = None

        def next_page():
            nonlocal pages
            if pages is None:
                pages = opener(self.after)
            try:
                return next(pages, None)
            except BaseException:
                pages = None  # the next try starts a new stream after the last key given
                raise

        while (page := retry(self.url, next_page, policy=self.policy)) is not None:
            for rel, size, version in page:
                if self._skip is not None:
                    if rel.startswith(self._skip):
                        self.after = max(self.after, rel)  # keys may sort after the folder + LAST
                        continue
                    self._skip = None
                self.after = rel
                yield rel, size, version
            if self._skip is not None:  # the skipped folder may run on past this page: ask after it
                pages = None

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
                self.own_marker = True
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
            self.own_marker |= any(len(c["Key"]) == len(prefix) for c in answer.get("Contents", [])[:1])
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


def _nameable(key: str) -> bool:
    """Whether obstore can start a listing after this key: object_store's paths have no empty, '.' or
    '..' segment and no trailing '/'."""
    return not key.endswith("/") and all(part not in ("", ".", "..") for part in key.split("/"))


def _timeout(policy: RemotePolicy | None) -> float:
    return (policy or RemotePolicy()).timeout
