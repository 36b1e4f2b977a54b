"""Listing a folder on a store one page at a time: what the walk of SRC and the clean-up of OUT read.

fsspec's `ls` keeps a whole folder's listing as a dict per object, twice (its answer and its
cache): a folder of 10^6 objects would cost the client ~1 GB. Here an S3 folder is read a page of
1,000 objects at a time, each page retried alone, and only the caller keeps what it needs.
"""

from __future__ import annotations

import hashlib
import heapq
from typing import Iterator, NamedTuple

from shardkit.store.remote import RemoteError, RemotePolicy
from shardkit.store.calls import bound, filesystem, retry

PAGE = 1000  # objects per listing request (S3's maximum)


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
    fs, path = filesystem(url, policy)
    if _pages_s3(fs):
        yield from _s3_folder(fs, url, path, policy)
        return
    yield from _fsspec_folder(fs, url, path, policy)


S3_CALL = "_call_s3"  # s3fs's private request call: see _pages_s3


def _pages_s3(fs) -> bool:
    """Whether to list through s3fs's private `_call_s3` (ListObjectsV2 a page at a time, MaxKeys as
    asked); without it (another s3fs), fsspec's public listing of the folder serves, all at once."""
    return type(fs).__name__ == "S3FileSystem" and callable(getattr(fs, S3_CALL, None))


def _s3_folder(fs, url: str, path: str, policy: RemotePolicy | None) -> Iterator[Entry]:
    from fsspec.asyn import sync

    bucket, _, key = path.partition("/")
    prefix = key.strip("/") + "/" if key.strip("/") else ""
    args = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/", "MaxKeys": PAGE}
    while True:
        call = getattr(fs, S3_CALL)
        page = retry(url, lambda: sync(fs.loop, call, "list_objects_v2", **args, **bound(fs, 0, policy)), policy=policy)
        dirs = [Entry(p["Prefix"][len(prefix):-1], True, 0, "") for p in page.get("CommonPrefixes", [])]
        files = [Entry(c["Key"][len(prefix):], False, int(c["Size"]), str(c.get("ETag", c.get("LastModified", ""))))
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
    """Whether anything lies at or below `url` (a file, or a folder holding one): one small request."""
    fs, path = filesystem(url, policy)
    if _pages_s3(fs):
        from fsspec.asyn import sync

        bucket, _, key = path.partition("/")
        page = retry(url, lambda: sync(fs.loop, getattr(fs, S3_CALL), "list_objects_v2", Bucket=bucket, Prefix=key,
                                       MaxKeys=1, **bound(fs, 0, policy)), policy=policy)
        return bool(page.get("KeyCount") or page.get("Contents"))
    return bool(retry(url, lambda: fs.exists(path), policy=policy))

