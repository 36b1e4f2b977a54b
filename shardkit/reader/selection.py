"""Which samples where= keeps: kept counts per shard, to plan epochs over kept samples only, and one
shard's mask, made when a process first reads that shard.

Epochs are planned over kept samples exactly as over all of them: positions and "kept ids" count
kept samples (shard by shard, in the reader's shard order), so the order, the split over ranks and
workers, resume at another world size, len() and ds[i] are the same code and the same guarantees.
One step is added where the plan asks its order for ids (`SelectedOrder`, a few batches at a time):
a kept id becomes the stored id the reader reads, through the shard's mask (reader.masks). A process
reads the attribute columns of the shards it reads, when it first reads them; the counts come from
the manifest's attribute table (`shardkit annotate OUT --select EXPR` stores them), or, for an
expression not stored there, from one pass over the expression's columns of every shard's
attribute table, in the process that makes the dataset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from shardkit.errors import ConfigError, ShardError
from shardkit.store.local import join, sha256_bytes
from shardkit.store.remote import read_bytes
from shardkit.manifest.attributes import load_attributes
from shardkit.reader.masks import make_mask
from shardkit.reader.order import shard_offsets
from shardkit.reader.partition import locate
from shardkit.reader.where import Where

log = logging.getLogger(__name__)
MASKS_KEPT = 64  # masks per process: as many as open shards (BatchReader.MAX_OPEN_SHARDS)
EXPLAIN_SHARDS = 1000  # attribute tables read to explain an empty selection (2.2 ms each, local)


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

    `counts` are kept samples per shard and `offsets` their running sums (kept ids); `stored(ids)`
    gives the reader's ids of kept ids. Masks are made under a lock: the fetch-ahead thread walks
    the same plan as the reader.
    """

    def __init__(self, parts: list[Part], policy=None):
        self.parts, self.policy = parts, policy
        self.first = shard_offsets([len(p.ids) for p in parts])  # first shard index of each part
        self.stored_offsets = shard_offsets(np.concatenate([p.samples for p in parts]))
        self._masks: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._tables = None  # tables(), made when a state is first saved or loaded
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
            mask = make_mask(_evaluate(part, shard_id, self.policy))
            kept[j] = mask.kept
            self._keep(first + j, mask)
        log.info("where=%r: counted the kept samples of %d shards from their attribute tables in %.1f s (`shardkit "
                 "annotate %s --select %r` stores the counts with the dataset: no process then reads them all)",
                 part.where.text, len(part.ids), time.perf_counter() - start, part.root, part.where.text)
        return kept

    def stored(self, ids) -> np.ndarray:
        """The reader's ids (stored rows, shard by shard) of kept ids."""
        shard_idx, ranks = locate(np.asarray(ids, np.int64), self.offsets)
        return self.stored_offsets[shard_idx] + self.rows(shard_idx, ranks)

    def mask(self, s: int):
        """Shard s's mask (None where its dataset has no where=), made on first use, the last MASKS_KEPT kept."""
        with self._lock:
            if s in self._masks:
                self._masks.move_to_end(s)
                return self._masks[s]
        p = int(np.searchsorted(self.first, s, side="right")) - 1
        part = self.parts[p]
        mask = None
        if part.where is not None:
            mask = make_mask(_evaluate(part, int(part.ids[s - self.first[p]]), self.policy))
            if mask.kept != self.counts[s]:  # the attribute table changed since the counts were taken
                raise ShardError(f"where={part.where.text!r} keeps {mask.kept} samples of shard "
                                 f"{int(part.ids[s - self.first[p]])} of {part.root}, the plan counted "
                                 f"{int(self.counts[s])}: its attributes changed while this run read it; restart it")
        self._keep(s, mask)
        return mask

    def _keep(self, s: int, mask) -> None:
        with self._lock:
            self._masks[s] = mask
            if len(self._masks) > MASKS_KEPT:
                self._masks.popitem(last=False)

    def rows(self, shard_idx: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """Stored rows of the kept samples (shard_idx[i], kept rank ranks[i]): grouped by shard with one
        stable sort, each group through its shard's mask (reader.masks)."""
        ranks = np.asarray(ranks, np.int64)
        if not len(ranks):
            return ranks
        if shard_idx[0] == shard_idx[-1] and (shard_idx == shard_idx[0]).all():  # one shard: no grouping
            mask = self.mask(int(shard_idx[0]))
            return ranks if mask is None else mask.rows(ranks).astype(np.int64, copy=False)
        order = np.argsort(shard_idx, kind="stable")
        shards, wanted = shard_idx[order], ranks[order]
        cuts = [0, *(np.flatnonzero(shards[1:] != shards[:-1]) + 1).tolist(), len(order)]
        out = np.empty_like(ranks)
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            mask = self.mask(int(shards[lo]))
            out[order[lo:hi]] = wanted[lo:hi] if mask is None else mask.rows(wanted[lo:hi])
        return out

    def rank(self, s: int, row: int) -> int | None:
        """The kept rank of stored `row` of shard s, None when where= leaves it out."""
        mask = self.mask(s)
        return row if mask is None else mask.rank(row)

    def mask_bytes(self) -> tuple[int, int]:
        """(bytes the masks held now take, rows they cover): what where= costs this process in memory."""
        held = [m for m in self._masks.values() if m is not None]
        return sum(m.nbytes for m in held), sum(m.size for m in held)

    def tables(self) -> list[dict | None]:
        """Per part, the attribute tables its where= selects from (None without where=), for a loader
        state: `digest`, an xxh3 of their sha256s in reader order, and `tables`, 8 hex digits of each
        sha256 (4 bytes a shard in the state), enough to name the tables that changed on a resume."""
        import xxhash

        if self._tables is None:
            self._tables = []
            for p in self.parts:
                if p.where is None:
                    self._tables.append(None)
                    continue
                sums = p.attributes.table.column("sha256").to_pylist()
                sums = [sums[i] for i in np.searchsorted(p.attributes.ids, p.ids).tolist()]
                self._tables.append({"digest": xxhash.xxh3_64_hexdigest("\n".join(sums).encode()),
                                     "tables": "".join(h[:8] for h in sums)})
        return self._tables

    def __getstate__(self):
        return {**self.__dict__, "_masks": OrderedDict(), "_lock": None}  # masks are made in the process that reads

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.Lock())

    def __deepcopy__(self, memo):
        """Itself: a copy of a plan for another thread of this process (the remote walk) shares the
        masks made here (read-only, behind the lock) rather than reading the attribute tables again."""
        return self


def _evaluate(part: Part, shard_id: int, policy) -> np.ndarray:
    """The where= mask of stored shard `shard_id` of `part`, from its attribute table."""
    info = part.attributes.info(shard_id)
    return part.where.mask(read_columns(part.root, info, part.where.columns, policy))


def check_not_empty(selection: Selection, names: list[str]) -> None:
    """A ConfigError when the where= of a part of `selection` keeps no sample: the expression, the samples
    it was asked of, and how many pass each of its conditions (a comparison that none passes, or two that
    pass for different samples), counted over the attribute tables (at most EXPLAIN_SHARDS)."""
    for part, name, kept in zip(selection.parts, names, np.split(selection.counts, selection.first[1:-1])):
        if part.where is None or int(kept.sum()):
            continue
        ids = part.ids[:EXPLAIN_SHARDS].tolist()
        passing = dict.fromkeys(part.where.conditions(), 0)
        for shard_id in ids:
            info = part.attributes.info(int(shard_id))
            for c, n in part.where.passing(read_columns(part.root, info, part.where.columns, selection.policy)).items():
                passing[c] += n
        total = int(part.samples[:len(ids)].sum())
        over = "" if len(ids) == len(part.ids) else f" (over its first {len(ids)} of {len(part.ids)} shards)"
        counts = "; ".join(f"{c}: {n} of {total}" for c, n in passing.items())
        raise ConfigError(f"where={part.where.text!r} keeps none of the {int(part.samples.sum())} samples of "
                          f"{name} (the selection is empty, not the dataset); samples that pass each "
                          f"condition{over}: {counts}; loosen the expression (a missing value passes no "
                          "comparison)")


def check_tables(selection: Selection, saved: list, names: list[str]) -> None:
    """A ConfigError unless the where= of each part of `selection` selects from the attribute tables it
    selected from when the state was saved (`saved`: tables() then; a part saved without any is not checked).
    Re-scored tables (`shardkit annotate`) may keep as many samples per shard, but others: a
    resume would then read some samples twice and others never."""
    for part, name, then, now in zip(selection.parts, names, saved, selection.tables()):
        if not isinstance(then, dict) or now is None or then.get("digest") == now["digest"]:
            continue
        old, new = str(then.get("tables", "")), now["tables"]
        changed = [j for j in range(len(part.ids)) if old[8 * j:8 * j + 8] != new[8 * j:8 * j + 8]]
        which = "which ones could not be told"
        if changed and len(old) == len(new):
            named = [f"{part.attributes.info(int(part.ids[j])).path} (shard {int(part.ids[j])})"
                     for j in changed[:3]]
            which = f"{len(changed)} of {len(part.ids)}: " + ", ".join(named) + (" …" if len(changed) > 3 else "")
        raise ConfigError(f"the loader state was saved while where={part.where.text!r} selected from other "
                          f"attribute tables of {name} than it does now ({which}): `shardkit annotate` rewrote "
                          "them since, so the samples kept differ even where their counts do not, and a resume "
                          "would read some twice and others never; resume against the tables the state was "
                          "saved with, or start without loading the state")


class SelectedOrder:
    """An epoch's order over kept samples (`order`: an EpochOrder or a MixtureOrder over kept counts)
    whose ids are the reader's: what EpochPlan splits (positions count kept samples) and reads
    (ids name stored rows). The plan asks for a few batches' ids at a time, so the masks' cost is
    paid per group of batches, not per batch."""

    def __init__(self, order, selection: Selection):
        self.order, self.selection = order, selection

    def __len__(self) -> int:
        return len(self.order)

    def ids(self, positions) -> np.ndarray:
        return self.selection.stored(self.order.ids(positions))


def part_of(root: str, manifest, shards, where: str | None, policy=None) -> Part:
    """The Part of one dataset read through `shards` (its shard table of one format), with its where=
    parsed and checked against the dataset's attribute columns (ConfigError naming them)."""
    part = Part(str(root), np.asarray(shards.ids, np.int64), np.asarray(shards.samples, np.int64))
    if where is None:
        return part
    if "tokens" in manifest.fields:  # checked first: the reason, not "no such column"
        raise ConfigError(f"where={where!r}: {root} holds token rows, which have no attributes: a packed row mixes "
                          "the ends and starts of several documents, so no row has one document's scores (and "
                          "attributes score text); choose before tokenizing: build --filter ... --tokenizer ..., "
                          "or build the tokens from the samples where= keeps")
    attributes = load_attributes(manifest, root, policy)
    types = {} if attributes is None else {c: spec["type"] for c, spec in attributes.columns.items()}
    part.where, part.attributes = Where(where, types), attributes
    return part
