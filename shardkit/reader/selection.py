"""Which samples where= keeps: kept counts per shard, to plan epochs over kept samples only, and one
shard's mask, made when a process first reads that shard.

Epochs are planned over kept samples exactly as over all of them: sample ids count kept samples
(shard by shard, in the reader's shard order), so the order, the split over ranks and workers,
resume at another world size, len() and ds[i] are the same code and the same guarantees. Only the
step from an id to a stored row changes: the kept rank within a shard becomes the shard's own row
through its mask. A process reads the attribute columns of the shards it reads, when it first
reads them; the counts come from the manifest's attribute table (`shardkit annotate OUT --select
EXPR` stores them), or, for an expression not stored there, from one pass over the expression's
columns of every shard's attribute table, in the process that makes the dataset.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from shardkit.errors import ConfigError, ShardError
from shardkit.fs import join, read_bytes, sha256_bytes
from shardkit.manifest.attributes import load_attributes
from shardkit.reader.order import shard_offsets
from shardkit.reader.where import Where

log = logging.getLogger(__name__)
MASKS_KEPT = 64  # masks per process: as many as open shards (BatchReader.MAX_OPEN_SHARDS)


# Per byte value: its set bits (popcount), and the position of its k-th set bit (SELECT[v, k]).
_POP = np.array([bin(v).count("1") for v in range(256)], np.uint8)
_SELECT = np.array([[[b for b in range(8) if v >> b & 1][k] if k < _POP[v] else 0 for k in range(8)]
                    for v in range(256)], np.uint8)


class Mask:
    """The kept rows of one shard in 0.625 bytes a row: one bit per row and, per byte (8 rows), the
    kept rows before it (uint32). `rows(ranks)` maps kept ranks to rows with one binary search and
    two table lookups per batch of ranks; `rank(row)` maps back. (Counts per 64-row word plus
    offsets per byte take 0.31 B a row but cost several numpy calls more: 128 us against 44 us per
    110 ranks, measured on the loaded 2-core VM, where a text sample loads in ~20-30 us.)"""

    __slots__ = ("bits", "before", "kept", "size")

    def __init__(self, keep: np.ndarray):
        keep = np.asarray(keep, bool)
        self.size = len(keep)
        self.bits = np.packbits(keep, bitorder="little")
        per_byte = _POP[self.bits].astype(np.int64)
        self.before = (np.cumsum(per_byte) - per_byte).astype(np.uint32)
        self.kept = int(per_byte.sum())

    def rows(self, ranks) -> np.ndarray:
        """The rows of the kept samples of ranks `ranks` (0 <= rank < kept)."""
        ranks = np.asarray(ranks, np.uint32)
        b = np.searchsorted(self.before, ranks, side="right") - 1  # the last byte with fewer kept rows before
        return b * 8 + _SELECT[self.bits[b], ranks - self.before[b]]

    def rank(self, row: int) -> int | None:
        """The kept rank of `row`, or None when the row is not kept."""
        b, bit = divmod(int(row), 8)
        value = int(self.bits[b])
        if not value >> bit & 1:
            return None
        return int(self.before[b]) + int(_POP[value & ((1 << bit) - 1)])

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes + self.before.nbytes


def read_columns(root: str, info, columns: list[str], policy=None, url: str | None = None):
    """Columns of one attribute table, checked: the file against the manifest's size and sha256 (it is
    read whole: a few bytes a sample), then its rows against the record's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    url = url or join(root, info.path)
    try:
        blob = read_bytes(url, policy)
    except FileNotFoundError as e:
        raise ShardError(f"attribute table {url} is missing: copy the whole dataset, or run `shardkit annotate` "
                         "again") from e
    if len(blob) != info.bytes or sha256_bytes(blob) != info.sha256:
        raise ShardError(f"attribute table {url} does not match the manifest (size or sha256): it was replaced or "
                         "damaged; run `shardkit annotate` again")
    table = pq.ParquetFile(pa.BufferReader(blob), page_checksum_verification=True).read(columns=columns,
                                                                                         use_threads=False)
    if table.num_rows != info.rows:
        raise ShardError(f"attribute table {url} has {table.num_rows} rows, the manifest says {info.rows}")
    return table


@dataclass
class Part:
    """One dataset of what is read: where its attributes are, its shards' ids (reader order) and
    sample counts, and its where= (None: every sample)."""

    root: str
    ids: np.ndarray
    samples: np.ndarray
    where: object = None  # reader.where.Where
    attributes: object = None  # manifest.attributes.Attributes


class Selection:
    """Kept counts and masks over the shards of one or more datasets (a mixture's), in reader order.

    `counts` are kept samples per shard and `offsets` their running sums: a BatchReader given this
    selection counts ids over kept samples and asks `rows` for the stored rows.
    """

    def __init__(self, parts: list[Part], policy=None):
        self.parts, self.policy = parts, policy
        self.first = shard_offsets([len(p.ids) for p in parts])  # first shard index of each part
        self._masks: OrderedDict = OrderedDict()
        self.counts = np.concatenate([self._kept(p, int(f)) for p, f in zip(parts, self.first)]).astype(np.int64)
        self.offsets = shard_offsets(self.counts)

    def _kept(self, part: Part, first: int) -> np.ndarray:
        if part.where is None:
            return np.asarray(part.samples, np.int64)
        stored = part.attributes.kept(part.where.text)
        if stored is not None:  # id order -> this reader's shard order
            return stored[np.searchsorted(part.attributes.ids, part.ids)]
        start = time.perf_counter()
        kept = np.zeros(len(part.ids), np.int64)
        for j, shard_id in enumerate(part.ids.tolist()):  # the last MASKS_KEPT masks stay for the reads
            mask = Mask(self._evaluate(part, shard_id))
            kept[j] = mask.kept
            self._keep(first + j, mask)
        log.info("where=%r: counted the kept samples of %d shards from their attribute tables in %.1f s (`shardkit "
                 "annotate %s --select %r` stores the counts with the dataset: no process then reads them all)",
                 part.where.text, len(part.ids), time.perf_counter() - start, part.root, part.where.text)
        return kept

    def _evaluate(self, part: Part, shard_id: int) -> np.ndarray:
        info = part.attributes.info(shard_id)
        return part.where.mask(read_columns(part.root, info, part.where.columns, self.policy))

    def mask(self, s: int) -> Mask | None:
        """Shard s's mask (None where its dataset has no where=), made on first use, the last MASKS_KEPT kept."""
        if s in self._masks:
            self._masks.move_to_end(s)
            return self._masks[s]
        p = int(np.searchsorted(self.first, s, side="right")) - 1
        part = self.parts[p]
        mask = None
        if part.where is not None:
            mask = Mask(self._evaluate(part, int(part.ids[s - self.first[p]])))
            if mask.kept != self.counts[s]:  # the attribute table changed since the counts were taken
                raise ShardError(f"where={part.where.text!r} keeps {mask.kept} samples of shard "
                                 f"{int(part.ids[s - self.first[p]])} of {part.root}, the plan counted "
                                 f"{int(self.counts[s])}: its attributes changed while this run read it; restart it")
        self._keep(s, mask)
        return mask

    def _keep(self, s: int, mask: Mask | None) -> None:
        self._masks[s] = mask
        if len(self._masks) > MASKS_KEPT:
            self._masks.popitem(last=False)

    def rows(self, shard_idx: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """Stored rows of the kept samples (shard_idx[i], kept rank ranks[i])."""
        out = np.asarray(ranks, np.int64).copy()
        if len(out) and shard_idx[0] == shard_idx[-1] and (shard_idx == shard_idx[0]).all():  # one shard
            mask = self.mask(int(shard_idx[0]))
            return out if mask is None else mask.rows(out)
        for s in np.unique(shard_idx).tolist():
            mask = self.mask(s)
            if mask is not None:
                at = shard_idx == s
                out[at] = mask.rows(out[at])
        return out

    def rank(self, s: int, row: int) -> int | None:
        """The kept rank of stored `row` of shard s, None when where= leaves it out."""
        mask = self.mask(s)
        return row if mask is None else mask.rank(row)

    def mask_bytes(self) -> tuple[int, int]:
        """(bytes the masks held now take, rows they cover): what where= costs this process in memory."""
        held = [m for m in self._masks.values() if m is not None]
        return sum(m.nbytes for m in held), sum(m.size for m in held)

    def __getstate__(self):
        return {**self.__dict__, "_masks": OrderedDict()}  # masks are made in the process that reads


def part_of(root: str, manifest, shards, where: str | None, policy=None) -> Part:
    """The Part of one dataset read through `shards` (its shard table of one format), with its where=
    parsed and checked against the dataset's attribute columns (ConfigError naming them)."""
    part = Part(str(root), np.asarray(shards.ids, np.int64), np.asarray(shards.samples, np.int64))
    if where is None:
        return part
    attributes = load_attributes(manifest, root, policy)
    types = {} if attributes is None else {c: spec["type"] for c, spec in attributes.columns.items()}
    part.where, part.attributes = Where(where, types), attributes
    if "tokens" in manifest.fields:  # packed rows mix documents: no row has one document's attributes
        raise ConfigError(f"where={where!r}: {root} holds token rows; filter the text dataset before tokenizing "
                          "(build --filter), or build the tokens from the samples where= keeps")
    return part
