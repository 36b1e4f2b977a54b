"""--dedup-paragraphs on Dask, on the dedup step's partitions of the inventory and hash-range shuffle.

1. One task per partition (runs of the inventory's pieces): each document's non-blank lines hashed,
   the entries (hash, row, line) sorted and cut at GRID fixed hash ranges, with each row's key hash,
   in one file (OUT/.shardkit/paragraphs/).
2. One task per run of hash ranges (~ENTRIES_PER_TASK entries, chosen from the partitions' counts):
   its slice of every partition file; of each set of equal paragraphs every copy after the first
   (smallest document id in key order, then line) is a removal, written sorted by document id.
3. One task per partition: its removals from every range file (a binary search each), as the
   partition's drop file: key hashes, sorted, and the line numbers each loses.
A build unit finds its samples' partition by key and reads that drop file once per process.
Memory: a task holds its partition's entries (16 B a paragraph), its ranges' entries
(~ENTRIES_PER_TASK x 16 B, ~32 MB), or its partition's removals; the client the partition list
and ~32 KB of range counts per partition.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import threading
from dataclasses import dataclass

import numpy as np

from shardkit.contract import decode_text, key_hash
from shardkit.duplicates.paragraphs import GRID, cells_per_task, drop_lines, later_copies, partition_entries
from shardkit.duplicates.store import ArrayFile, save_arrays
from shardkit.errors import RejectedInput
from shardkit.jobs.tasks import progress_bar, run_tasks

ENTRIES_PER_TASK = 2_000_000
STAT = "curation.dedup-paragraphs"
VERSION = 1


@dataclass(frozen=True)
class Part:
    index: int
    pieces: tuple
    path: str  # stage 1 file
    drops: str  # stage 3 file


@dataclass(frozen=True)
class ParagraphDrops:
    """What the build's units need: each partition's first key and drop file (picklable, small)."""

    first_keys: tuple
    paths: tuple
    digest: str  # of every decision: part of the shards' fingerprint


def _texts(part: Part, source):
    for row, ((key, _, _), ref) in enumerate(zip(source.names(list(part.pieces)), source.refs(list(part.pieces)))):
        try:
            value = ref.make().fields.get("txt")
        except RejectedInput:  # the build rejects and records it itself
            value = None
        yield row, key, None if value is None else decode_text(value)[0]


def entries_task(part: Part, source) -> dict:
    """Stage 1 (kept when an earlier run wrote it)."""
    if not os.path.exists(part.path):
        arrays, meta = partition_entries(_texts(part, source))
        first = next(iter(source.names(list(part.pieces[:1]))), ("",))
        meta["first_key"] = first[0]
        save_arrays(part.path, arrays, meta)
    f = ArrayFile(part.path)
    return dict(f.meta, counts=np.diff(f["bounds"]).tolist())


def removals_task(job: tuple, parts: list[tuple[str, int]]) -> int:
    """Stage 2, job = ((a, b), file): the later copies among the entries of grid cells [a, b) of every
    partition (`parts`: (file, first id) each)."""
    cells, path = job
    if os.path.exists(path):
        return ArrayFile(path).rows("gid")
    h, gid, para = [], [], []
    for file, base in parts:
        f = ArrayFile(file)
        lo, hi = f.slice("bounds", cells[0], cells[1] + 1)[[0, -1]].tolist()
        h.append(f.slice("entries.h", lo, hi))
        gid.append(f.slice("entries.row", lo, hi).astype(np.int64) + base)
        para.append(f.slice("entries.para", lo, hi))
    h, gid, para = (np.concatenate(x) if x else np.empty(0, np.int64) for x in (h, gid, para))
    later = later_copies(h, gid, para)
    order = np.lexsort((para[later], gid[later]))
    save_arrays(path, {"gid": gid[later][order], "para": para[later][order].astype(np.uint32)})
    return len(later)


def drops_task(job: tuple, range_files: list[str]) -> str:
    """Stage 3, job = (partition, its first id, its rows): its removals, by key hash; returns their digest."""
    part, base, rows = job
    gids, paras = [], []
    for path in range_files:
        f = ArrayFile(path)
        lo, hi = f.searchsorted("gid", base), f.searchsorted("gid", base + rows)
        gids.append(f.slice("gid", lo, hi) - base)
        paras.append(f.slice("para", lo, hi))
    row, para = np.concatenate(gids), np.concatenate(paras)
    keys = ArrayFile(part.path)["keys"][row] if len(row) else np.empty(0, np.uint64)
    order = np.lexsort((para, keys))
    keys, para = keys[order], para[order]
    unique, starts = np.unique(keys, return_index=True)
    arrays = {"keys": unique, "offsets": np.append(starts, len(keys)).astype(np.int64), "para": para}
    save_arrays(part.drops, arrays)
    return hashlib.sha256(unique.tobytes() + para.tobytes() + np.diff(arrays["offsets"]).tobytes()).hexdigest()


def dedup_paragraphs(inv, source, partition_size: int, client, workdir: str, progress: bool) -> ParagraphDrops:
    """Find the later copies of every paragraph in the inventory (in key order): the three stages."""
    from shardkit.sources.plan import plan_shards

    os.makedirs(workdir, exist_ok=True)
    parts = []
    for plan in plan_shards(inv, 1 << 62, partition_size):
        h = hashlib.sha256(f"{VERSION}|{plan.fingerprint(inv, 'paragraphs')}".encode()).hexdigest()[:16]
        parts.append(Part(plan.id, tuple(plan.pieces), os.path.join(workdir, f"part-{plan.id:05d}-{h}.bin"),
                          os.path.join(workdir, f"drops-{plan.id:05d}-{h}.bin")))
    with progress_bar(len(parts), desc="paragraphs", unit="part", enabled=progress) as bar:
        metas = run_tasks(entries_task, parts, client=client, bar=bar, name="paragraph-entries", shared=(source,))
    bases = np.concatenate([[0], np.cumsum([m["rows"] for m in metas])]).tolist()
    counts = np.sum([m["counts"] for m in metas], axis=0) if metas else np.zeros(GRID, np.int64)
    ranges = cells_per_task(np.asarray(counts), ENTRIES_PER_TASK)
    tag = hashlib.sha256("|".join(p.path for p in parts).encode()).hexdigest()[:16]
    range_files = [os.path.join(workdir, f"removals-{tag}-{a:04d}-{b:04d}.bin") for a, b in ranges]
    run_tasks(removals_task, list(zip(ranges, range_files)), client=client, name="paragraph-removals",
              shared=([(p.path, base) for p, base in zip(parts, bases)],))
    digests = run_tasks(drops_task, list(zip(parts, bases, [m["rows"] for m in metas])), client=client,
                        name="paragraph-drops", shared=(range_files,))
    _remove_stale(workdir, {os.path.basename(f) for p in parts for f in (p.path, p.drops)} |
                  {os.path.basename(f) for f in range_files})
    return ParagraphDrops(tuple(m["first_key"] for m in metas), tuple(p.drops for p in parts),
                          hashlib.sha256("".join(digests).encode()).hexdigest()[:16])


def _remove_stale(folder: str, keep: set) -> None:
    for name in os.listdir(folder):
        if name not in keep:
            os.remove(os.path.join(folder, name))


_OPEN: dict = {}  # this process's drop files, read once each
_OPEN_LOCK = threading.Lock()


def _drop_file(path: str):
    with _OPEN_LOCK:
        if path not in _OPEN:
            f = ArrayFile(path)
            _OPEN[path] = (f["keys"], f["offsets"], f["para"])
        return _OPEN[path]


def drop_paragraphs(samples, *, drops: ParagraphDrops, stats: dict, dropped: list):
    """Stage: remove each sample's later paragraph copies; a text left without a non-blank line is
    counted and listed (rule 'emptied') and left out."""
    for sample in samples:
        value = sample.fields.get("txt")
        i = bisect.bisect_right(drops.first_keys, sample.key) - 1
        if value is None or i < 0:
            yield sample
            continue
        keys, offsets, para = _drop_file(drops.paths[i])
        k = np.uint64(key_hash(sample.key))
        j = int(np.searchsorted(keys, k))
        if j < len(keys) and keys[j] == k:
            lines = para[offsets[j]:offsets[j + 1]].tolist()
            stats[f"{STAT}.paragraphs"] = stats.get(f"{STAT}.paragraphs", 0) + len(lines)
            text = drop_lines(decode_text(value)[0], lines)
            if not text.strip():
                stats[f"{STAT}.emptied"] = stats.get(f"{STAT}.emptied", 0) + 1
                dropped.append((sample.key, sample.meta.get("source_path"), sample.meta.get("source_row"),
                                "dedup-paragraphs", "emptied"))
                continue
            sample.fields["txt"] = text
        yield sample
