"""StreamingDataset: an IterableDataset over a shardkit dataset folder (local or any fsspec URL)."""

from __future__ import annotations

import dataclasses

import numpy as np

from shardkit.config import StreamConfig
from shardkit.errors import ConfigError
from shardkit.identity import rank_world
from shardkit.manifest import load_manifest
from shardkit.reader.base import GROUP_ROWS, EpochDataset, shards_digest  # noqa: F401  (GROUP_ROWS: where it always was)
from shardkit.reader.batches import BatchReader
from shardkit.reader.partition import EpochPlan, rank_size
from shardkit.reader.lookup import MISSING, Lookup
from shardkit.reader.position import Position
from shardkit.reader.selection import SelectedOrder, Selection, check_not_empty, check_tables, part_of
from shardkit.reader.tokens import TokenBatches, resolve as resolve_tokens


class StreamingDataset(EpochDataset):
    """Streams a dataset built by `shardkit build`: exactly-once over ranks x workers, shuffled.

    `options` are StreamConfig fields (seed, shuffle, shuffle_buffer, fields, format,
    drop_remainder, cache_dir, cache_limit, on_error, variant, dtype, tokens, mask_boundaries, keys,
    checksums, timeout, retries, connections, fetch_ahead, where). `where="lang == 'en' and
    gopher_quality"` streams only the samples whose attributes satisfy it (shardkit.reader.where):
    len(), the split over ranks and workers, resume and ds[i] count those alone. Iterated alone it yields one decoded
    sample dict at a time; `batches()` yields whole batches (what `make_loader`'s workers run). A tokenized dataset yields
    input_ids and labels (position_ids and document_ids when `fields` names them; shardkit.reader.tokens).
    `transform` maps one decoded sample dict, `batch_transform` one batch dict. Progress through
    the epoch lives in `position`, reading and decoding in `reader`. `ds[i]` and `ds.get(key)` read
    one sample by its index or its key (shardkit.reader.lookup).
    """

    def __init__(self, src: str, config: StreamConfig | None = None, *, transform=None,
                 batch_transform=None, **options):
        self.config = stream_config(config, options, "StreamingDataset")
        self.src, self.transform, self.batch_transform = str(src), transform, batch_transform
        self.manifest = load_manifest(self.src, self.config.remote_policy())
        if not self.manifest.formats:  # a ShardWriter closed before any write, a build with --allow-empty
            raise ConfigError(f"dataset {self.src!r} holds no samples (its manifest lists no shards): write "
                              "samples into it, or rebuild it from a folder that has some")
        token_options, requested = resolve_tokens(self.manifest.fields, self.config, self.config.fields)
        self.fields = resolve_fields(self.manifest.fields, requested, self.config.fields)
        self.shards = self.manifest.shards_of(read_format(self.manifest, self.config.format))
        self.counts = self.shards.samples.astype(np.int64)  # columns: no object per shard
        # Token datasets build their batches in reader/tokens.py (packed rows: all of it).
        self.tokens = None if token_options is None else TokenBatches(
            self.manifest.fields["tokens"], self.shards, token_options, self.config.keys is not False)
        if self.tokens is not None and self.tokens.packed and self.config.keys is None:
            self.tokens.keys = False  # row keys are just (shard, row): only when asked for
        keys = self.config.keys is not False if self.tokens is None else self.tokens.keys
        self.reader = BatchReader(self.src, self.manifest.fields, self.fields, self.shards, self.config,
                                  self.tokens, keys)
        self.selection = None
        if self.config.where is not None:  # epochs over the kept samples only (reader/selection.py)
            self.selection = Selection([part_of(self.src, self.manifest, self.shards, self.config.where,
                                                self.config.remote_policy())], self.config.remote_policy())
            self.counts = self.selection.counts
            check_not_empty(self.selection, [repr(self.src)])  # not "the dataset has no samples"
        self.rank, self.world_size = rank_world()
        self.position = Position()
        self._lookup, self._digest = None, None
        self.epoch_plan(0)  # validates the split early: an empty rank is an error here, not mid-run

    @property
    def field_specs(self) -> dict:
        """Name -> spec of every field of the dataset (the manifest's)."""
        return self.manifest.fields

    def epoch_plan(self, epoch: int, layers=(), batch_size: int = 1, drop_last: bool = False,
                   world_size: int | None = None) -> EpochPlan:
        """This rank's plan of `epoch` (after resume `layers`), O(shards) to compute; rank 0's
        at another `world_size` (a saved state's)."""
        plan = dataclasses.replace(self.plan, batch_size=batch_size, drop_last=drop_last)
        rank, world = (self.rank, self.world_size) if world_size is None else (0, world_size)
        order = plan.order(self.counts, epoch)
        if self.selection is not None:  # positions over kept samples, ids the reader's (stored rows)
            order = SelectedOrder(order, self.selection)
        return EpochPlan(order, plan, rank, world, layers)

    def plan_fields(self) -> dict:
        c = self.config
        fields = {"samples": int(self.counts.sum()), "shards": shards_digest(self.counts), "shuffle": c.shuffle,
                  "shuffle_buffer": c.shuffle_buffer, "drop_remainder": c.drop_remainder}
        if c.where is not None:  # two expressions may keep equal counts: the state names its own
            fields["where"] = self.selection.parts[0].where.text
        return fields

    def state_extra(self) -> dict:
        """What the shards hold (an xxh3 of their sha256s) and where they were: a state of another
        dataset with the same shard counts is refused, the same shard files copied elsewhere resume."""
        extra = {"checksums": self.digest(), "dataset": self.src}
        if self.selection is not None:  # the attribute tables where= selected from (a re-score changes them)
            extra["attributes"] = self.selection.tables()[0]
        return extra

    def digest(self) -> str:
        """A digest of the read shards' checksums (the manifest's table, read once when asked)."""
        if self._digest is None:
            self._digest = self.shards.content_digest()
        return self._digest

    def check_state(self, state: dict) -> None:
        if "mixture" in state:
            raise ConfigError("the loader state was saved from a Mixture: resume it with the same Mixture")
        # A state of an earlier version has no digest: checked by counts only, as it always was. Other
        # counts are named by the loader's own check, more precisely than a digest could.
        ours = self.plan_fields()
        if any(k in state and state[k] != ours[k] for k in ("samples", "shards")):
            return
        if "checksums" in state and state["checksums"] != self.digest():
            raise ConfigError(f"the loader state was saved from dataset {state.get('dataset', '(not recorded)')!r} "
                              f"(shards digest {state['checksums']}), which holds other shards than {self.src!r} "
                              f"(digest {self.digest()}): resume with the dataset the state was saved from, or "
                              "start this one without loading the state")
        if self.selection is not None and "attributes" in state:  # a state of an earlier version has none
            check_tables(self.selection, [state["attributes"]], [repr(self.src)])

    def __len__(self) -> int:
        """Samples this rank yields per epoch (the same on every rank)."""
        return rank_size(int(self.counts.sum()), self.world_size, self.config.drop_remainder)

    @property
    def lookup(self):
        """Random access (shardkit.reader.lookup.Lookup): made on first use."""
        if self._lookup is None:
            self._lookup = Lookup(self)
        return self._lookup

    def __getitem__(self, index: int) -> dict:
        """Sample `index` of the dataset (0 .. samples-1 in manifest order, i.e. key order; negative
        counts from the end), decoded and checked as streaming yields it; IndexOutOfRange (an
        IndexError) outside. Augmented fields show their epoch-0 variant."""
        return self.lookup.sample(self.lookup.check_index(index))

    def get(self, key: str, default=MISSING):
        """The sample whose `__key__` is `key`, decoded as streaming yields it; a missing key raises
        SampleNotFound (a KeyError), or returns `default` when one is given. The shard is found from
        the key bounds in the manifest; a dataset built before they were recorded is scanned shard by
        shard instead (slower: rebuild it to record them)."""
        return self.lookup.get(key, default)

    def __getstate__(self):
        return dict(self.__dict__, _lookup=None)


def stream_config(config: StreamConfig | None, options: dict, who: str) -> StreamConfig:
    """`config` with `options` (StreamConfig fields) applied; a wrong name lists the valid ones."""
    try:
        return dataclasses.replace(config or StreamConfig(), **options)
    except TypeError as e:
        valid = ", ".join(f.name for f in dataclasses.fields(StreamConfig))
        raise ConfigError(f"{who}: {e}; valid options: {valid}") from e


def read_format(manifest, asked: str | None = None) -> str:
    """The shard format to stream: `asked`, else tar when the dataset has both.

    Tar is the faster or level for every field kind, measured with 2 workers under shuffle with
    checksums checked (bench/RESULTS.md): this version's Parquet is level for raw images and JPEG
    (0.97x, 0.98x: its media are sliced by offset too), 0.86x for text (compressed row groups, and a
    checksum per decoded value), and packed token rows are one gather from the tar's member (about
    2x their Parquet read); Parquet written by an older shardkit decodes row groups (0.67-0.79x).
    """
    if asked is not None:
        return asked
    return "tar" if "tar" in manifest.formats else manifest.formats[0]


def resolve_fields(known: dict, requested, asked=None) -> list[str]:
    """The manifest fields to read: `requested` (what `asked` leaves once token training fields are
    taken out), checked against the manifest, else all but augmentation variants."""
    if requested is None:  # variants of an augmented field are read through it
        return sorted(n for n, spec in known.items() if "variant_of" not in spec)
    bad = [f for f in requested if f not in known]
    if bad:
        raise ConfigError(f"fields={list(asked if asked is not None else requested)!r}: {bad} not in this "
                          f"dataset; it has {sorted(known)}")
    return list(requested)
