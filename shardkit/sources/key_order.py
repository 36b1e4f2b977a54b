"""Global key order as pieces: runs of file samples (rows of one sorted Arrow table) and row-file blocks.

A row file's keys `{stem}/{number}` are contiguous in key order unless some other key falls among
them (e.g. `docs/000007x.txt` beside `docs.jsonl`) or collides with one. Such a file is "exploded":
its rows join the file samples as single entries with their own keys, exactly as every sample was
ordered before. Every other row file stays one block, placed where its first key sorts, so the client
holds one entry per row file, not one per row.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from shardkit.errors import Rejection
from shardkit.sources import walk as W
from shardkit.sources.index import RowCount, key_bounds, keys_of, keys_table, load_index

ATOMS = -1  # Piece.source of a run of the sorted file-sample table
RENAMED = "key collision"  # the reason of a renamed sample's record in errors.jsonl (it is kept)


@dataclass(frozen=True)
class Piece:
    """Consecutive samples in key order: rows [start, stop) of the atom table (source ATOMS) or of a
    row file's index (source = the row file's id)."""

    source: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def _bisect(keys, key: str, right: bool = False) -> int:
    """bisect over a sorted Arrow string array (O(log n) element reads)."""
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        value = keys[mid].as_py()
        if value < key or (right and value == key):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _sorted(table):
    import pyarrow.compute as pc

    return table.take(pc.sort_indices(table, [("key", "ascending")])).combine_chunks()


def _source_of(row: dict) -> str:
    if row["row_file"] >= 0:
        return f"{row['files'][0]}:{row['number']}"
    return row["files"][0]


def _shown(row: dict, counts, policy=None) -> str:
    """The sample's source as errors.jsonl names it: a file, `docs.jsonl:LINE` or `shards/a.tar:MEMBER`."""
    count = counts[row["row_file"]] if row["row_file"] >= 0 else None
    if count is not None and count.keys is not None:
        return f"{row['files'][0]}:{keys_table(count.keys, policy).column('member')[row['row']].as_py()}"
    return _source_of(row)


def unique_keys(table, counts, policy=None) -> tuple[object, list[Rejection]]:
    """Rename colliding keys (e.g. 'a.jsonl' line 1 vs 'a/000001.txt', or two tars' members)
    `{key}_{sha1(source)[:8]}`, sorted; with one record per renamed sample (for errors.jsonl). The new
    key depends on the sample's own source only, so the rule gives the same keys in any listing order.
    `policy` (here and below): the job's RemotePolicy, for row indexes on a store."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = _sorted(table)
    keys = table.column("key")
    if len(keys) < 2:
        return table, []
    same = pc.equal(keys.slice(0, len(keys) - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
    dup = np.zeros(len(keys), bool)
    dup[:-1] |= same
    dup[1:] |= same
    if not dup.any():
        return table, []
    new_keys, stamps = keys.to_pylist(), table.column("stamp").to_numpy().copy()
    renamed = []
    for i in np.flatnonzero(dup).tolist():
        row = {n: table.column(n)[i].as_py() for n in ("files", "row_file", "row")}
        if row["row_file"] >= 0:
            row["number"] = int(load_index(counts[row["row_file"]], policy)["number"][row["row"]])
        digest = hashlib.sha1(_source_of(row).encode("utf-8")).hexdigest()[:8]
        old, new_keys[i] = new_keys[i], f"{new_keys[i]}_{digest}"
        stamps[i] = W.stamp_digest(f"{stamps[i]}|{new_keys[i]}")
        renamed.append(Rejection(_shown(row, counts, policy), "source", f"{RENAMED}: another source gives the key {old!r}; "
                                 f"written as {new_keys[i]!r}"))
    table = table.set_column(0, "key", pa.array(new_keys, pa.string()))
    table = _sorted(table.set_column(table.schema.get_field_index("stamp"), "stamp", pa.array(stamps)))
    assert not pc.any(pc.equal(table.column("key").slice(0, len(keys) - 1), table.column("key").slice(1))).as_py(), \
        "sample keys must be unique"
    return table, sorted(renamed, key=lambda r: (r.path, r.reason))


def _range(rf: W.RowFile, count: RowCount, policy=None) -> tuple[str, str]:
    return key_bounds(rf.stem_key, count, policy)


def exploded(table, row_files, counts, policy=None) -> set[int]:
    """Row files whose key range holds another sample's key, or overlaps another row file's range (on
    either side: `dupA.tar` holding `x/1` .. `y/9` and `dupA/x.tar` holding `5` both explode)."""
    keys = _sorted(table).column("key")
    live = sorted((_range(rf, counts[rf.id], policy), rf.id) for rf in row_files if counts[rf.id].rows)
    out, reach = set(), None  # reach: the largest last key of the ranges sorted before this one
    for i, ((first, last), rid) in enumerate(live):
        if _bisect(keys, first) != _bisect(keys, last, right=True):
            out.add(rid)
        if reach is not None and first <= reach:  # overlaps an earlier range (its first key sorts before)
            out.add(rid)
        if i + 1 < len(live) and live[i + 1][0][0] <= last:  # overlaps a later one (the next starts first)
            out.add(rid)
        reach = last if reach is None else max(reach, last)
    return out


def explode(rf: W.RowFile, count: RowCount, kinds: int, policy=None):
    """The rows of one row file as file-sample table rows (key, its file, its row position)."""
    import pyarrow as pa

    index = load_index(count, policy)
    numbers = np.asarray(index["number"])
    keys = keys_of(rf.stem_key, count, 0, len(numbers), policy)
    est = np.diff(np.concatenate(([0], np.asarray(index["cum"]))))
    stamps = [W.stamp_digest(f"{k}|{rf.stamp()}|{n}") for k, n in zip(keys, numbers.tolist())]
    n = len(keys)
    return pa.table({"key": pa.array(keys, pa.string()), "files": pa.array([[rf.rel]] * n, pa.list_(pa.string())),
                     "top": pa.array([rf.top] * n, pa.string()), "size": pa.array(est, pa.int64()),
                     "kinds": pa.array(np.full(n, kinds, np.int8)), "stamp": pa.array(stamps, pa.int64()),
                     "row_file": pa.array(np.full(n, rf.id, np.int32)),
                     "row": pa.array(np.arange(n, dtype=np.int64))}, schema=W.schema())


def pieces_in_order(table, blocks: list[tuple[str, int, int]]) -> list[Piece]:
    """Interleave the sorted table with blocks (first key, row file id, rows) at their sort positions."""
    keys = table.column("key")
    placed = sorted((_bisect(keys, first), first, rid, rows) for first, rid, rows in blocks)
    out, at = [], 0
    for pos, _, rid, rows in placed:
        if pos > at:
            out.append(Piece(ATOMS, at, pos))
            at = pos
        out.append(Piece(rid, 0, rows))
    if len(keys) > at:
        out.append(Piece(ATOMS, at, len(keys)))
    return out
