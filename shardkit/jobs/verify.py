"""`shardkit verify`: every file a dataset's manifest names, re-hashed and sized against it, and every
intact shard opened as a reader opens it to count its samples: a local folder or a store."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass, field

import shardkit.store as store
from shardkit.store.remote import RemoteError
from shardkit.store.local import local_path, sha256_file
from shardkit.manifest import load_manifest, safe_relpath

CHUNK = 4 << 20  # bytes hashed (and, from a store, copied) at a time


@dataclass
class VerifyReport:
    """What verify found: one line per problem (`missing   path`, `size      path: ...`, `checksum  path:
    ...`, `count     path: ...`), over `checked` files of a dataset of `samples` samples."""

    dataset: str
    samples: int
    checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_dataset(root: str, policy=None) -> VerifyReport:
    """Check a dataset against its manifest (which load_manifest already checks: counts add up, paths
    stay inside ROOT). Raises ManifestError when there is no readable manifest. `policy` (a RemotePolicy)
    is what every read from a store waits as (None: the reader's defaults for the manifest, then
    store.JOB_POLICY for the files)."""
    from shardkit.errors import ShardError
    from shardkit.reader.shards import open_shard

    manifest = load_manifest(root, policy)
    root = store.check_location(root, "dataset")
    report = VerifyReport(root, manifest.samples)
    with tempfile.TemporaryDirectory(prefix="shardkit-verify-") as tmp:
        for shard in manifest.shards:
            files = _shard_files(shard)
            with _checked(root, files, report, tmp, policy) as paths:
                if paths is None:  # a file is missing or differs: counting it would say nothing more
                    continue
                try:
                    open_shard(paths[0], shard, manifest.fields, shard.path,
                               index_path=paths[1] if len(paths) > 1 else None)
                except ShardError as e:
                    report.problems.append(f"count     {shard.path}: {e}")
        _verify_attributes(root, manifest, report, tmp, policy)
    return report


def _verify_attributes(root: str, manifest, report: VerifyReport, tmp: str, policy=None) -> None:
    """Attribute tables (build --annotate, shardkit annotate): on a local disk each is checked against
    its shard (jobs.annotate.verify_attributes: keys, the content it was computed from); on a store,
    its size and sha256."""
    from shardkit.errors import ManifestError
    from shardkit.jobs.annotate import verify_attributes
    from shardkit.manifest.attributes import load_attributes

    if not store.is_url(root):
        problems, checked = verify_attributes(root, manifest)
        report.problems += problems
        report.checked += checked
        return
    try:
        attributes = load_attributes(manifest, root, policy, check=False)
    except ManifestError as e:
        report.problems.append(f"attributes {e}")
        return
    for info in attributes.infos() if attributes is not None else []:
        with _checked(root, [(info.path, info.bytes, info.sha256)], report, tmp, policy):
            pass


def _shard_files(shard) -> list[tuple[str, int, str]]:
    files = [(shard.path, shard.bytes, shard.sha256)]
    if shard.index:
        files.append((shard.index["path"], shard.index["bytes"], shard.index["sha256"]))
    return files


@contextlib.contextmanager
def _checked(root: str, files, report: VerifyReport, tmp: str, policy=None):
    """Size and sha256 of each file against the manifest; yields local paths of the files (copies, from
    a store, removed afterwards) when all match, else None, the problems added to `report`."""
    paths, bad = [], False
    try:
        for rel, size, digest in files:
            report.checked += 1
            found = _local(root, rel) if not store.is_url(root) else _download(store.join(root, rel), tmp, policy)
            if found is None:
                report.problems.append(f"missing   {rel}")
            elif found[1] != size:
                report.problems.append(f"size      {rel}: {found[1]} bytes, manifest says {size}")
            elif found[2]() != digest:
                report.problems.append(f"checksum  {rel}: sha256 differs from the manifest")
            else:
                paths.append(found[0])
                continue
            bad = True
            if found is not None:
                paths.append(found[0])
        yield None if bad else paths
    finally:
        if store.is_url(root):
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)


def _local(root: str, rel: str):
    """(path, size, sha256 thunk) of a local file, or None when it is not a file."""
    path = os.path.join(local_path(root), safe_relpath(rel))
    if not os.path.isfile(path):
        return None
    return path, os.path.getsize(path), lambda: sha256_file(path)


def _download(url: str, tmp: str, policy=None):
    """(local copy, size, sha256 thunk) of a file on a store, hashed as it streams in; None if missing."""
    path = os.path.join(tmp, hashlib.sha256(url.encode()).hexdigest()[:16] + "-" + url.rsplit("/", 1)[-1])
    h, n = hashlib.sha256(), 0
    try:
        source = store.open_source(url, policy)
    except RemoteError as e:
        if e.not_found:
            return None
        raise
    with source, open(path, "wb") as out:
        while chunk := source.read(CHUNK):
            h.update(chunk)
            out.write(chunk)
            n += len(chunk)
    digest = h.hexdigest()
    return path, n, lambda: digest
