"""The corpus as a set of partition files: global ids → (partition, row), gathered by positioned reads.

A task opens the files it needs and reads only the rows or the bucket range it asks for; nothing
here loads a whole partition, let alone the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardkit.duplicates.signatures import BAND_ENTRY, EXACT_ENTRY, IMAGE_ENTRY
from shardkit.duplicates.store import ArrayFile, read_strings

ENTRY_DTYPES = {"exact": EXACT_ENTRY, "text": BAND_ENTRY, "image": IMAGE_ENTRY}


@dataclass(frozen=True)
class PartitionRef:
    """One signature partition: its file, its band file (for the current LSH parameters), its first id."""

    path: str
    bands_path: str
    base: int
    rows: int


class PartitionSet:
    """Read access to every partition by global id (picklable: files open lazily in each process);
    `policy`: the job's RemotePolicy, for partition files on a store."""

    def __init__(self, refs: list[PartitionRef], policy=None):
        self.refs, self.policy = list(refs), policy
        self.bases = np.array([r.base for r in self.refs] + [self.total], np.int64)
        self._open: dict[tuple[int, str], ArrayFile] = {}

    @property
    def total(self) -> int:
        return (self.refs[-1].base + self.refs[-1].rows) if self.refs else 0

    def __getstate__(self):
        return {"refs": self.refs, "policy": self.policy}

    def __setstate__(self, state):
        self.__init__(state["refs"], state.get("policy"))

    def file(self, i: int, which: str = "sig") -> ArrayFile:
        key = (i, which)
        if key not in self._open:
            ref = self.refs[i]
            self._open[key] = ArrayFile(ref.path if which == "sig" else ref.bands_path, self.policy)
        return self._open[key]

    def _groups(self, ids: np.ndarray):
        """(partition, positions in ids, local rows) for the partitions the ids fall in."""
        part = np.searchsorted(self.bases, ids, side="right") - 1
        order = np.argsort(part, kind="stable")
        starts = np.flatnonzero(np.concatenate([[True], part[order][1:] != part[order][:-1]])) if len(ids) else []
        for s, e in zip(list(starts), list(starts[1:]) + [len(ids)]):
            sel = order[s:e]
            p = int(part[sel[0]])
            yield p, sel, ids[sel] - self.refs[p].base

    def column(self, name: str, ids) -> np.ndarray:
        """Values of a per-row array (kind, digests, image_hashes, source_rows, …) at global ids."""
        ids = np.asarray(ids, np.int64)
        out = None
        for p, sel, rows in self._groups(ids):
            got = self.file(p).take(name, rows)
            if out is None:
                out = np.empty((len(ids),) + got.shape[1:], got.dtype)
            out[sel] = got
        return out if out is not None else np.empty(0)

    def signatures(self, ids) -> np.ndarray:
        """MinHash signatures of text documents (with at least one shingle) at global ids."""
        ids = np.asarray(ids, np.int64)
        out = None
        for p, sel, rows in self._groups(ids):
            f = self.file(p)
            got = f.take("signatures", f.take("sig_row", rows))
            if out is None:
                out = np.empty((len(ids), got.shape[1]), got.dtype)
            out[sel] = got
        return out if out is not None else np.empty((0, 0), np.uint32)

    def sets(self, ids) -> list[np.ndarray]:
        """Shingle-hash sets (stored with --verify) of text documents at global ids."""
        ids = np.asarray(ids, np.int64)
        out: list = [None] * len(ids)
        for p, sel, rows in self._groups(ids):
            f = self.file(p)
            sig_rows = f.take("sig_row", rows).astype(np.int64)
            lo, hi = f.take("set_offsets", sig_rows).tolist(), f.take("set_offsets", sig_rows + 1).tolist()
            for k, a, b in zip(sel.tolist(), lo, hi):
                out[k] = f.slice("set_values", a, b)
        return out

    def strings(self, name: str, ids) -> list[str]:
        """Keys or sources at global ids."""
        ids = np.asarray(ids, np.int64)
        out: list = [None] * len(ids)
        for p, sel, rows in self._groups(ids):
            for k, v in zip(sel.tolist(), read_strings(self.file(p), name, rows)):
                out[k] = v
        return out

    def entries(self, which: str, task: int) -> tuple[np.ndarray, np.ndarray]:
        """Entries of every partition in bucket range `task`: (entries, their global ids).

        `which` is 'exact', 'text' or 'image'; each partition costs a read of the range's two
        bounds and one read per column of its slice (band files hold the bounds of every range).
        """
        dtype = ENTRY_DTYPES[which]
        parts, ids = [], []
        for i, ref in enumerate(self.refs):
            f = self.file(i, "bands")
            a, b = f.slice(f"{which}.bounds", task, task + 2).tolist()
            if b > a:
                chunk = np.empty(b - a, dtype)
                for name in dtype.names:
                    chunk[name] = f.slice(f"{which}.{name}", a, b)
                parts.append(chunk)
                ids.append(chunk["row"].astype(np.int64) + ref.base)
        if not parts:
            return np.empty(0, dtype), np.empty(0, np.int64)
        return np.concatenate(parts), np.concatenate(ids)
