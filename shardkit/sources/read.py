"""Reading samples for a task: pieces of the inventory → RowRefs that make Samples (errors name the source).

A SourceReader is what a build task receives once (scattered): the scan options, the row files with
their counts and labels, and the path of the sorted file-sample table saved under OUT/.shardkit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from shardkit.store.remote import RemoteError
from shardkit.sources import walk as W
from shardkit.sources.key_order import ATOMS, Piece
from shardkit.sources.index import RowCount, RowRef, ScanOptions, keys_of, load_index
from shardkit.sources.rows import jsonl_rows
from shardkit.sources.tar_rows import tar_rows
from shardkit.sources.tars import CLS_MEMBERS
from shardkit.store.local import is_url

ATOMS_NAME = "samples-{}.arrow"


@lru_cache(maxsize=2)
def _atoms(path: str, policy=None):
    """The sorted file-sample table, memory-mapped once per worker process (from a local copy when OUT
    is on a store: its name changes with its content)."""
    import pyarrow as pa

    from shardkit.store import local_copy

    return pa.ipc.open_file(pa.memory_map(local_copy(path, policy=policy))).read_all()


def save_atoms(table, labels, state_dir: str, digest: str, policy=None) -> str | None:
    """Write the sorted file samples (key, files, row file, row, label) for tasks to read by position
    (`policy`: the job's RemotePolicy, for a state folder on a store)."""
    import pyarrow as pa

    from shardkit.store import exists, join, makedirs, writer

    if not len(table):
        return None
    path = join(state_dir, ATOMS_NAME.format(digest))
    if exists(path, policy):
        return path
    makedirs(state_dir)
    out = table.select(["key", "files", "row_file", "row"]).append_column("label", pa.array(labels))
    with writer(path, policy=policy) as f, pa.ipc.new_file(f, out.schema) as ipc:
        ipc.write_table(out)
    return path


@dataclass(frozen=True)
class SourceReader:
    """Turns pieces into RowRefs in key order (picklable, sent to every worker once)."""

    opts: ScanOptions
    row_files: tuple[W.RowFile, ...]
    counts: dict[int, RowCount]
    row_labels: dict[int, int]
    label_index: dict | int | None
    atoms_path: str | None

    def refs(self, pieces: list[Piece]):
        for piece in pieces:
            if piece.source == ATOMS:
                yield from self._atom_refs(piece.start, piece.stop)
            else:
                yield from self._row_refs(piece.source, piece.start, piece.stop, None, None)

    def names(self, pieces: list[Piece]):
        """(key, first file, line or row number or None) of each sample of the pieces, in the order of
        `refs`: how a sample that cannot be read is still named (read here, from the atom table and
        the row indexes, not from the inputs)."""
        for piece in pieces:
            if piece.source == ATOMS:
                rows = _atoms(self.atoms_path, self.opts.policy).slice(piece.start, len(piece))
                rows = rows.select(["key", "files", "row_file", "row"])
                for row in rows.to_pylist():
                    number = None
                    if row["row_file"] >= 0:
                        number = int(load_index(self.counts[row["row_file"]], self.opts.policy)["number"][row["row"]])
                    yield row["key"], row["files"][0], number
                continue
            rf, count = self.row_files[piece.source], self.counts[piece.source]
            keys = keys_of(rf.stem_key, count, piece.start, piece.stop, self.opts.policy)
            numbers = load_index(count, self.opts.policy)["number"][piece.start:piece.stop].tolist()
            yield from zip(keys, [rf.rel] * len(keys), numbers)

    def _converter(self, rid: int):
        from shardkit.sources.parquet_files import RowConverter

        return RowConverter(self.opts, self.counts[rid].parquet, self.label_index, self.row_files[rid].rel)

    def _row_refs(self, rid: int, start: int, stop: int, keys, labels):
        """Rows of a row file; the folder label (or the given per-row labels) becomes field cls."""
        rf, count = self.row_files[rid], self.counts[rid]
        try:  # read now: a file that vanished or changed since it was counted rejects its rows
            if rf.kind == "jsonl":
                refs = list(jsonl_rows(self.opts, rf, count, start, stop, keys))
            elif rf.kind == "tar":
                cls = self.row_labels.get(rid) == CLS_MEMBERS  # labels from the tar's cls members
                refs = list(tar_rows(self.opts, rf, count, start, stop, keys, cls))
            else:
                from shardkit.sources.parquet_files import parquet_rows

                refs = list(parquet_rows(self.opts, rf, count, start, stop, self._converter(rid), keys))
        except (OSError, ValueError, RemoteError) as e:
            if isinstance(e, RemoteError) and not e.not_found:
                raise  # a store that did not answer fails the task (naming the URL), it rejects no row
            why = getattr(e, "detail", None) or getattr(e, "strerror", None) or e
            reason = f"unreadable: {why} (it changed while the build ran?)"
            numbers = load_index(count, self.opts.policy)["number"][start:stop].tolist()
            refs = [RowRef.failed(f"{rf.rel}:{n}", reason) for n in numbers]
        for i, ref in enumerate(refs):
            label = self.row_labels.get(rid, -1) if labels is None else labels[i]
            yield ref if label < 0 else RowRef(ref.source, _labelled(ref.make, label))

    def _atom_refs(self, start: int, stop: int):
        from shardkit.sources import InputRecord, read_record

        rows = _atoms(self.atoms_path, self.opts.policy).slice(start, stop - start).to_pylist()
        i, fetched, ahead = 0, None, _Ahead(self.opts.root, rows, self.opts.policy)
        while i < len(rows):
            row = rows[i]
            if row["row_file"] < 0:
                if ahead.on and not (fetched and row["files"][0] in fetched):
                    fetched = ahead.take(i)
                label = row["label"] if row["label"] >= 0 else None
                rec = InputRecord(row["key"], tuple(row["files"]), label, 0)
                yield RowRef(rec.source, lambda rec=rec, got=fetched: read_record(self.opts.root, rec,
                                                                                   self.opts.text_field, data=got,
                                                                                   policy=self.opts.policy))
                i += 1
                continue
            j = i + 1  # consecutive rows of one exploded row file are read together
            while (j < len(rows) and rows[j]["row_file"] == row["row_file"]
                   and rows[j]["row"] == rows[j - 1]["row"] + 1):
                j += 1
            yield from self._row_refs(row["row_file"], row["row"], rows[j - 1]["row"] + 1,
                                      [r["key"] for r in rows[i:j]], [r["label"] for r in rows[i:j]])
            i = j


PREFETCH = 64  # file samples whose files a task fetches from a store at once (~64 requests in flight)


class _Ahead:
    """The files of a task's file samples on a store, fetched PREFETCH samples at a time, the next
    batch in flight while the stages work on this one: a task waits for the store only when it
    works faster than the store answers (one GET at a time, it waited a round trip per image)."""

    def __init__(self, root: str, rows: list[dict], policy=None):
        self.root, self.rows, self.on, self.policy = root, rows, is_url(root), policy
        self.next = self._start(0) if self.on else None

    def _start(self, i: int):
        from shardkit.store import fetch_sources, join

        rels = [rel for row in self.rows[i:i + PREFETCH] if row["row_file"] < 0 for rel in row["files"]]
        return i, rels, fetch_sources([join(self.root, rel) for rel in rels], self.policy)

    def take(self, i: int) -> dict:
        """{relative path: bytes or the error reading it} of the samples from row i on."""
        start, rels, fetch = self.next if self.next is not None and self.next[0] == i else self._start(i)
        self.next = self._start(i + PREFETCH) if i + PREFETCH < len(self.rows) else None
        return dict(zip(rels, fetch.result()))


def _labelled(make, label: int):
    def run():
        sample = make()
        sample.fields["cls"] = label
        return sample

    return run
