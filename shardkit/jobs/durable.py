"""The durable step every writer of a dataset shares (build, build_map, ShardWriter), on a local disk
or a store: unit tables handed between tasks, a completion marker written once a piece's files are
durable, reuse of finished pieces on a rerun, and the manifest written last.

Order is the guarantee: a piece's shard files are durable (fsync'd, or uploaded: one object each,
never visible half-written) before its marker names them, and every marker's files are in place
before the manifest names them; the manifest is retired before the first new file is written. So
whatever stops a job (kill -9, a lost worker, a store that stops answering), nothing a marker or a
manifest names is missing or partial, and a rerun redoes only the pieces without a valid marker.

On a store every call waits as the job's RemotePolicy, each function's `policy` (None: store.JOB_POLICY).
"""

from __future__ import annotations

import json
import logging
import os
import threading

import shardkit.store as store
from shardkit.contract import ShardInfo
from shardkit.errors import count_by_reason
from shardkit.manifest import MANIFEST_NAME, TABLE_NAME, Manifest, shard_files, write_manifest

log = logging.getLogger("shardkit.jobs")
STATE_DIR = ".shardkit"


def files_of(infos) -> list[tuple[str, int]]:
    """(relative path, bytes) of every file the shards consist of: shard files and index sidecars."""
    out = []
    for info in infos:
        out.append((info.path, info.bytes))
        if info.index:
            out.append((info.index["path"], info.index["bytes"]))
    return out


# --------------------------------------------------------------------------------------------- units

def save_unit(table, url: str, policy=None) -> str:
    """A work unit's table as an Arrow file for its shard step, which may run elsewhere. Temp name,
    then rename, but no fsync: a unit file lives for seconds and no later run reads it (fsync here
    cost as much as writing the shard). On a store: one upload."""
    import pyarrow as pa

    with store.writer(url, durable=False, policy=policy) as f, pa.ipc.new_file(f, table.schema) as ipc:
        ipc.write_table(table)
    return url


def load_unit(url: str, policy=None):
    """A unit's table: memory-mapped from a local disk, read whole from a store (at most a shard's bytes,
    what the shard step holds anyway)."""
    import pyarrow as pa

    if not store.is_url(url):
        return pa.ipc.open_file(pa.memory_map(url)).read_all()
    return pa.ipc.open_file(pa.py_buffer(store.read(url, policy))).read_all()


# ------------------------------------------------------------------------------------------- markers

def mark_done(out: str, marker: str, fingerprint: str, result: dict, infos, units=(), extra=(),
              policy=None) -> None:
    """A finished piece: its shard files (and `extra` files, e.g. an attribute table) durable where they
    belong (fsync'd locally; uploaded from the staging folder to a store), then its marker OUT/`marker`,
    then its unit files dropped, so that a marker always names whole files and a retried step finds
    either the marker or its units."""
    for rel in [rel for rel, _ in files_of(infos)] + list(extra):
        store.publish(out, rel, policy=policy)
    store.write(store.join(out, marker), json.dumps({"fingerprint": fingerprint, "result": result},
                                                     sort_keys=True), policy)
    for url in units:
        store.remove(url, policy)


def shard_sizes(out: str, policy=None) -> dict[str, int]:
    """{relative path: bytes} of the files under OUT/shards, from one listing: what a client checks
    markers against (a store is not asked once per file)."""
    return {f"shards/{name}": size for name, size in store.listdir(store.join(out, "shards"), policy).items()}


def reusable(out: str, marker: str, fingerprint: str, sizes: dict | None = None,
             data: bytes | None = None, policy=None) -> dict | None:
    """The result recorded by OUT/`marker` if its fingerprint is `fingerprint` and every file it names
    is there with its size (from `sizes`, see shard_sizes, else asked file by file); else None.
    `data`: the marker's bytes, already read (see read_markers)."""
    try:
        record = json.loads(data if data is not None else store.read(store.join(out, marker), policy))
        if record["fingerprint"] != fingerprint:
            return None
        result = record["result"]
        infos = [ShardInfo.from_dict(s) for s in result["shards"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for rel, nbytes in files_of(infos):
        size = sizes.get(rel) if sizes is not None else store.size(store.join(out, rel), policy)
        if size != nbytes:
            return None
    return result


def reused(out: str, folder: str, markers: dict, check, policy=None) -> dict:
    """The one reuse loop of the build and the map: {id: check(id, sizes, data)} for each piece (its
    marker under `markers`: id -> marker path) that check accepts. The markers are read at once
    (concurrently on a store) and checked against one listing of OUT/shards on a store (`sizes`)."""
    if not any_marker(out, folder, policy):
        return {}
    data = read_markers(out, list(markers.values()), policy)
    sizes = shard_sizes(out, policy) if store.is_url(out) else None
    found = {i: data[m] and check(i, sizes, data[m]) for i, m in markers.items()}
    return {i: result for i, result in found.items() if result}


def any_marker(out: str, folder: str, policy=None) -> bool:
    """Whether OUT/`folder` holds any marker (a previous run got that far)."""
    url = store.join(out, folder)
    if not store.is_url(url):
        return os.path.isdir(url) and any(True for _ in os.scandir(url))
    from shardkit.store.listing import has_any

    return has_any(url + "/", policy)


def read_markers(out: str, markers: list[str], policy=None) -> dict[str, bytes | None]:
    """The bytes of many markers (None for a missing one): on a store, read concurrently."""
    urls = [store.join(out, m) for m in markers]
    got = store.read_many(urls, policy)
    return {m: got[u] for m, u in zip(markers, urls)}


def check_markers(out: str, markers: list[str], policy=None) -> None:
    """Every one of these markers is in OUT (one listing per folder): pieces whose steps ended on a
    store wrote theirs before they returned, so a missing one is a fault, said before any manifest."""
    from shardkit.errors import ShardkitError

    present: dict[str, dict] = {}
    missing = []
    for m in markers:
        folder, name = m.rsplit("/", 1)
        if folder not in present:
            present[folder] = store.listdir(store.join(out, folder), policy)
        if name not in present[folder]:
            missing.append(m)
    if missing:
        raise ShardkitError(f"{len(missing)} pieces of {out} have no completion marker ({missing[0]} first) though "
                            "their tasks ended: rerun the same command to build them")


def remove_markers(out: str, folder: str, prefix: str, keep: int, policy=None) -> None:
    """Markers `{prefix}NNNNN.json` in OUT/`folder` numbered `keep` or more (a previous, larger run's)."""
    for name in store.listdir(store.join(out, folder), policy):
        if name.startswith(prefix) and name[len(prefix):len(prefix) + 5].isdigit() \
                and int(name[len(prefix):len(prefix) + 5]) >= keep:
            store.remove(store.join(out, folder, name), policy)


# ------------------------------------------------------------------------------------------- finish

def retire_manifest(out: str, policy=None) -> None:
    """Delete OUT's manifest before any shard is written: until the new one is written last, nothing
    may name shards that are about to be replaced (a writer that crashes leaves no manifest)."""
    for name in (MANIFEST_NAME, TABLE_NAME):
        store.remove(store.join(out, name), policy)


def remove_unlisted(out: str, infos, policy=None) -> None:
    """Delete OUT/shards/data-* files that `infos` do not name (left by an earlier, larger run)."""
    keep = shard_files(infos)
    for name in store.listdir(store.join(out, "shards"), policy):
        if name.startswith("data-") and f"shards/{name}" not in keep:
            store.remove(store.join(out, "shards", name), policy)


def write_errors(out: str, rejections, prior: str = "", policy=None) -> None:
    """OUT/errors.jsonl: one line per rejected input (after `prior` lines, e.g. an input dataset's)."""
    store.write(store.join(out, "errors.jsonl"), prior + "".join(r.to_json() + "\n" for r in rejections),
                policy)


def finish(out: str, manifest: Manifest, policy=None) -> Manifest:
    """Stale shard files removed, then the manifest, last: call it only once every shard it names is
    durable (every marker written, or every writer flushed)."""
    remove_unlisted(out, manifest.shards, policy)
    write_manifest(out, manifest, policy)
    return manifest


def errors_record(rejections) -> dict:
    return {"count": len(rejections), "by_reason": count_by_reason(rejections)}


_SYNC: dict = {}  # this process's fsync thread and the shards handed to it
_SYNC_LOCK = threading.Lock()


def settle(out: str, fn, *args) -> None:
    """fn(*args), a piece's durable step (its files, then its marker, then its unit files dropped), for
    the build's shard step and the map's group step alike: on a store before the step returns (a lost
    worker takes no upload along); on a local disk on this process's fsync thread, so the next tasks
    run while the disk catches up (flush_durable waits for them all before the manifest)."""
    if store.is_url(out):
        fn(*args)
    else:
        in_background(fn, *args)


def in_background(fn, *args) -> None:
    """Run fn on this process's fsync thread: the task goes on computing while the disk catches up."""
    from concurrent.futures import ThreadPoolExecutor

    with _SYNC_LOCK:  # worker threads of one process share the fsync thread
        if "pool" not in _SYNC:
            _SYNC["pool"], _SYNC["jobs"] = ThreadPoolExecutor(1, thread_name_prefix="shardkit-fsync"), []
        _SYNC["jobs"].append(_SYNC["pool"].submit(fn, *args))


def flush_durable() -> int:
    """Wait until every shard this process wrote is on disk with its marker (raises the first failure).
    Run in every worker (and here) before the manifest names any shard."""
    with _SYNC_LOCK:
        jobs, _SYNC["jobs"] = _SYNC.get("jobs", []), []
    for job in jobs:
        job.result()
    return len(jobs)
