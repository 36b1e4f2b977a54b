"""Mixture: several shardkit datasets streamed as one, by weight, deterministic and resumable.

    mix = Mixture({"web": ("s3://bucket/web", 0.7), "code": ("data/code", 0.3)}, seed=0)
    loader = make_loader(mix, batch_size=64, num_workers=2)     # as for a StreamingDataset

The mixture's epoch is one global order (`mix_order.MixtureOrder`) that the reader's plan splits
over ranks and workers and narrows after a resume at another world size, exactly as it does one
dataset's order; the sources' samples share one id space and one BatchReader.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np

from shardkit.config import StreamConfig
from shardkit.contract import key_hash
from shardkit.errors import ConfigError, ManifestError, ShardkitError
from shardkit.identity import rank_world
from shardkit.manifest import load_manifest
from shardkit.reader.base import EpochDataset, shards_digest
from shardkit.reader.batches import DATASET_KEY, BatchReader, ShardSet
from shardkit.reader.dataset import read_format, resolve_fields, stream_config
from shardkit.reader.mix_order import ChunkPlan, MixtureOrder, SourceStreams
from shardkit.reader.mixing import MixConfig, MixPlan, Schedule, Source, epoch_units, source_of
from shardkit.reader.partition import EpochPlan, rank_size
from shardkit.reader.position import Position
from shardkit.reader.selection import SelectedOrder, Selection, check_not_empty, check_tables, part_of
from shardkit.reader.tokens import TokenBatches, resolve as resolve_tokens

log = logging.getLogger(__name__)

# What must agree between sources for a field to be read from all of them into one batch.
SPEC_KEYS = ("kind", "encoding", "dtype", "shape", "layout", "seq_len", "eos_id", "pad_id", "tokenizer_sha256",
             "variants")
MIX_OPTIONS = tuple(f.name for f in dataclasses.fields(MixConfig))
STREAM_OPTIONS = tuple(f.name for f in dataclasses.fields(StreamConfig))


class MixtureState:
    """A Mixture's side of the state contract: what fixes its order, where each source's stream stands
    (with a digest of its shards), and the check of a saved state against them on restore."""

    def plan_fields(self) -> dict:
        c = self.config
        counts = self.reader.shards.samples if self.selection is None else self.selection.counts
        fields = {"samples": self.mixplan.total * self.mix.unit, "shards": shards_digest(counts),
                  "shuffle": c.shuffle, "shuffle_buffer": c.shuffle_buffer, "drop_remainder": c.drop_remainder,
                  "mixing": self.mix.mixing, "unit": self.mix.unit}
        if self.selection is not None:
            fields["where"] = [None if p.where is None else p.where.text for p in self.selection.parts]
        return fields

    def state_extra(self) -> dict:
        """Where each source's stream stands at the start of the saved epoch, and what it gives that epoch."""
        extra = {"mixture": self._positions(self.epoch)}
        if self.selection is not None:  # the attribute tables each where= selected from
            extra["attributes"] = self.selection.tables()
        return extra

    def _positions(self, epoch: int) -> list[dict]:
        unit, starts, counts = self.mix.unit, self.mixplan.starts(epoch), self.mixplan.counts(epoch)
        out = []
        for i, name in enumerate(self.names):
            passes, offset = divmod(int(starts[i]) * unit, self.sizes[i])
            out.append({"name": name, "samples": self.sizes[i], "epoch_samples": int(counts[i]) * unit,
                        "pass": passes, "offset": offset, "checksums": self.digests()[i]})
        return out

    def digests(self) -> list[str]:
        """Per source, a digest of its shards' checksums: what tells two sources of equal size apart."""
        if self._digests is None:
            self._digests = [t.content_digest() for t in self._tables]
        return self._digests

    def check_state(self, state: dict) -> None:
        saved = state.get("mixture")
        if saved is None:
            raise ConfigError("the loader state was saved from a single dataset, not a mixture: resume it with "
                              "StreamingDataset")
        ours = self._positions(int(state["epoch"]))
        if [s["name"] for s in saved] != self.names:
            raise ConfigError(f"the loader state was saved with sources {[s['name'] for s in saved]}, this mixture has "
                              f"{self.names}: resume with the same sources")
        for then, now in zip(saved, ours):
            # Keys a state of an earlier version lacks are not checked.
            diff = [f"{k}={then[k]} then, {now[k]} now" for k in now if k in then and then[k] != now[k]]
            if diff:
                raise ConfigError(f"source {now['name']!r} of the saved state differs: {', '.join(diff)}; resume with "
                                  "the same datasets, weights and schedule (to change weights during training, "
                                  "give a schedule)")
        if self.selection is not None and "attributes" in state:  # a state of an earlier version has none
            check_tables(self.selection, state["attributes"], [f"source {n!r}" for n in self.names])


class Mixture(MixtureState, EpochDataset):
    """Several datasets (local or remote) streamed as one: usable wherever a StreamingDataset is.

    `sources`: {name: path | (path, weight) | {"path", "weight" | "repeat" | "choose", "format"} |
    Source} (or a list of (name, spec) pairs). `options`: StreamConfig fields (seed, shuffle,
    fields, cache_dir, checksums, ...) shared by every source, and MixConfig fields (samples,
    mixing, batch_size, schedule, step_samples, phase). Every batch carries `__dataset__`, each
    sample's source (an index into `names`). `proportions()` compares what was yielded with the
    targets. A source that cannot be read or is empty is an error here, naming it.
    """

    def __init__(self, sources, config: StreamConfig | None = None, *, mix: MixConfig | None = None,
                 transform=None, batch_transform=None, **options):
        unknown = sorted(set(options) - set(MIX_OPTIONS) - set(STREAM_OPTIONS))
        if unknown:
            raise ConfigError(f"Mixture: unknown options {unknown}; valid: {', '.join(MIX_OPTIONS + STREAM_OPTIONS)}")
        self.config = stream_config(config, {k: v for k, v in options.items() if k in STREAM_OPTIONS}, "Mixture")
        self.mix = dataclasses.replace(mix or MixConfig(), **{k: v for k, v in options.items() if k in MIX_OPTIONS})
        self.transform, self.batch_transform = transform, batch_transform
        pairs = list(sources.items()) if isinstance(sources, dict) else [tuple(p) for p in sources]
        if not pairs:
            raise ConfigError("Mixture needs at least one source: {name: path or (path, weight), ...}")
        self.names = [str(name) for name, _ in pairs]
        if len(set(self.names)) != len(self.names):
            raise ConfigError(f"source names {self.names}: each name once")
        self.sources = [source_of(name, spec) for name, spec in pairs]
        opened = [_open(name, s, self.config) for name, s in zip(self.names, self.sources)]
        self._setup_reader(opened)
        self.sizes = [int(c.sum()) for c in self.streams.counts]
        self._tables = [t for _, t in opened]  # for the content digests a saved state records
        self._digests: list[str] | None = None
        self.mixplan = _mix_plan(self.sources, self.sizes, self.mix, self.names)
        self.rank, self.world_size = rank_world()
        self.position = Position()
        self.planned = np.zeros(len(self.names), np.int64)  # main process: what the plan put in the batches
        self.observed = np.zeros(len(self.names), np.int64)  # ... and what the batches held
        self.untagged = 0  # samples of batches without their __dataset__ tags (a batch_transform dropped them)
        self._orders: dict = {}
        self._yielded: list = []  # main process: [(epoch, layers), first, end] runs yielded, not yet counted
        self.epoch_plan(0)  # validates the split early: an empty rank is an error here, not mid-run

    @classmethod
    def from_config(cls, spec, **overrides) -> "Mixture":
        """A mixture from a config dict (or a JSON file): {"sources": {...}, "seed": 0, "schedule": [...], ...}."""
        if isinstance(spec, str):
            with open(spec, encoding="utf-8") as f:
                spec = json.load(f)
        if not isinstance(spec, dict) or "sources" not in spec:
            raise ConfigError("a mixture config is a dict with 'sources' ({name: path or {path, weight}}) and "
                              "Mixture options (seed, samples, mixing, schedule, ...)")
        return cls(spec["sources"], **{k: v for k, v in spec.items() if k != "sources"}, **overrides)

    def _setup_reader(self, opened) -> None:
        manifests = [m for m, _ in opened]
        token_options, requested = resolve_tokens(manifests[0].fields, self.config, self.config.fields)
        self.fields = resolve_fields(manifests[0].fields, requested, self.config.fields)
        self.field_specs = manifests[0].fields
        for name, m in zip(self.names[1:], manifests[1:]):
            resolve_tokens(m.fields, self.config, self.config.fields)
            _check_fields(name, m.fields, self.names[0], self.field_specs, self.fields)
        shards = ShardSet([(s.path, t) for s, (_, t) in zip(self.sources, opened)])
        self.tokens = None if token_options is None else TokenBatches(
            self.field_specs["tokens"], shards, token_options, self.config.keys is not False)
        if self.tokens is not None and self.tokens.packed and self.config.keys is None:
            self.tokens.keys = False  # row keys are just (shard, row): only when asked for
        keys = self.config.keys is not False if self.tokens is None else self.tokens.keys
        self.reader = BatchReader(None, self.field_specs, self.fields, shards, self.config, self.tokens, keys,
                                  tag_parts=True)
        counts = [t.samples.astype(np.int64) for _, t in opened]
        wheres = [s.where if s.where is not None else self.config.where for s in self.sources]
        self.selection = None
        if any(w is not None for w in wheres):  # each source's kept samples only (reader/selection.py)
            self.selection = Selection([_part(name, s, m, t, w, self.config) for name, s, (m, t), w in
                                        zip(self.names, self.sources, opened, wheres)], self.config.remote_policy())
            check_not_empty(self.selection, [f"mixture source {n!r}" for n in self.names])
            counts = np.split(self.selection.counts, shards.first[1:-1])
        seeds = [key_hash(f"{self.config.seed}|{name}") for name in self.names]
        self.streams = SourceStreams(counts, seeds, self.config.shuffle, self.config.shuffle_buffer)

    def order(self, epoch: int) -> MixtureOrder:
        """Epoch `epoch`'s global order (the last two are kept)."""
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                self._orders.pop(next(iter(self._orders)))
            self._orders[epoch] = MixtureOrder(self.mixplan, epoch, self.config.seed, self.streams)
        return self._orders[epoch]

    def epoch_plan(self, epoch: int, layers=(), batch_size: int = 1, drop_last: bool = False,
                   world_size: int | None = None):
        """This rank's plan of `epoch` (rank 0's at another `world_size`); with batch-level mixing
        a plan over whole batches, seen in samples."""
        unit = self.mix.unit
        rank, world = (self.rank, self.world_size) if world_size is None else (0, world_size)
        plan = dataclasses.replace(self.plan, batch_size=max(1, batch_size // unit), drop_last=drop_last and unit == 1)
        order = self.order(epoch)
        if self.selection is not None:  # positions over kept samples, ids the reader's (stored rows)
            order = SelectedOrder(order, self.selection)
        if unit == 1:
            return EpochPlan(order, plan, rank, world, layers)
        layers = tuple((w, c // unit) for w, c in layers)
        return ChunkPlan(EpochPlan(order, plan, rank, world, layers), unit)

    def __len__(self) -> int:
        """Samples this rank yields per epoch (the same on every rank)."""
        return rank_size(self.mixplan.total, self.world_size, self.config.drop_remainder) * self.mix.unit

    def counts(self, epoch: int | None = None) -> dict[str, int]:
        """Samples of each source in `epoch` (default: the current one), over all ranks."""
        units = self.mixplan.counts(self.epoch if epoch is None else epoch)
        return {n: int(u) * self.mix.unit for n, u in zip(self.names, units)}

    def check_loader(self, batch_size: int, drop_last: bool) -> None:
        if self.mix.mixing == "batch" and batch_size != self.mix.batch_size:
            raise ConfigError(f"make_loader(batch_size={batch_size}) but the mixture takes one source per batch of "
                              f"{self.mix.batch_size}: give both the same batch size")

    def yielded(self, batch, size: int) -> None:
        """Count what this batch holds per source; note which planned positions it covered (their
        sources are counted when proportions() asks: per batch they cost the main process ~40 us)."""
        pos = self.position
        key, runs = (pos.epoch, pos.layers), self._yielded
        if runs and runs[-1][0] == key and runs[-1][2] == pos.consumed:
            runs[-1][2] += size
        else:
            runs.append([key, pos.consumed, pos.consumed + size])
        tags = batch.get(DATASET_KEY) if isinstance(batch, dict) else None
        if tags is not None:
            self.observed += np.bincount(np.asarray(tags, np.int64), minlength=len(self.names))
        else:
            self.untagged += size

    def proportions(self) -> dict:
        """Per source, in what this process's loader yielded so far: `samples` (counted in the batches),
        `observed` (their share), `target` (the share the plan put there), and `weight` (the target
        weight at the current position)."""
        _count_planned(self)
        if self.untagged:
            log.warning("%d yielded samples came in batches without %r (a batch_transform dropped it): 'samples' and "
                        "'observed' leave them out; keep the key in what batch_transform returns", self.untagged,
                        DATASET_KEY)
        pos = self.position
        weights = self.mixplan.weights(pos.epoch, pos.consumed * self.world_size // self.mix.unit)
        planned, observed = int(self.planned.sum()), int(self.observed.sum())
        return {name: {"samples": int(self.observed[i]),
                       "observed": float(self.observed[i] / observed) if observed else None,
                       "target": float(self.planned[i] / planned) if planned else float(weights[i]),
                       "weight": float(weights[i])}
                for i, name in enumerate(self.names)}

    def __getstate__(self):
        return dict(self.__dict__, _orders={}, _yielded=[])


def _mix_plan(sources: list[Source], sizes: list[int], mix: MixConfig, names: list[str]) -> MixPlan:
    """The mixture's MixPlan: units of each source per epoch, and the epoch's total (ConfigError when
    it holds none, or too many without a schedule)."""
    unit = mix.unit
    units = epoch_units(sources, sizes, mix)
    schedule = None
    if mix.schedule is not None:
        schedule = Schedule(mix.schedule, names, mix.step_samples)
        total = (mix.samples if mix.samples is not None else sum(sizes)) // unit
    else:
        total = int(units.sum())
    if total <= 0:
        raise ConfigError(f"the mixture's epoch holds no samples (sources {names}, counts {units.tolist()}"
                          f"{f', whole batches of {unit}' if unit > 1 else ''}): raise weights, repeat or choose")
    if schedule is None and total > 3_000_000_000:
        raise ConfigError(f"an epoch of {total} units: at most 3e9 without a schedule; give samples= smaller")
    return MixPlan(units, total, unit, schedule, mix.phase)


def _count_planned(mixture: Mixture) -> None:
    """Add the sources of the positions `mixture` yielded since the last count to its `planned`."""
    step = max(1, (1 << 20) // mixture.mix.unit) * mixture.mix.unit  # whole units: bounded memory for long runs
    for (epoch, layers), lo, hi in mixture._yielded:
        plan, order = mixture.epoch_plan(epoch, layers), mixture.order(epoch)
        for a in range(lo, hi, step):
            src = order.sources(plan.positions(a, min(hi, a + step)))
            mixture.planned += np.bincount(src, minlength=len(mixture.names)) * mixture.mix.unit
    mixture._yielded.clear()


def _open(name: str, source: Source, config: StreamConfig):
    """(manifest, shard table of the format read) of one source; errors name the source."""
    try:
        manifest = load_manifest(source.path, config.remote_policy())
        if manifest.samples == 0:
            raise ManifestError("it holds no samples")
        shards = manifest.shards_of(read_format(manifest, source.format or config.format))
    except ShardkitError as e:
        kind = ConfigError if isinstance(e, ConfigError) else ManifestError
        raise kind(f"mixture source {name!r} ({source.path}): {e}; fix or drop this source") from e
    return manifest, shards


def _part(name: str, source: Source, manifest, shards, where: str | None, config: StreamConfig):
    """The selection part of one source; a where= error names the source."""
    try:
        return part_of(source.path, manifest, shards, where, config.remote_policy())
    except ShardkitError as e:
        kind = ConfigError if isinstance(e, ConfigError) else ManifestError
        raise kind(f"mixture source {name!r} ({source.path}): {e}") from e


def _check_fields(name: str, fields: dict, first: str, specs: dict, read: list[str]) -> None:
    for f in read:
        if f not in fields:
            raise ConfigError(f"mixture source {name!r} has no field {f!r} (source {first!r} has it); read the fields "
                              f"they share with Mixture(..., fields=[...]): {name!r} has {sorted(fields)}")
        ours = {k: fields[f].get(k) for k in SPEC_KEYS}
        theirs = {k: specs[f].get(k) for k in SPEC_KEYS}
        if ours != theirs:
            raise ConfigError(f"field {f!r} differs between mixture sources {first!r} ({theirs}) and {name!r} "
                              f"({ours}): one batch cannot hold both; rebuild one of them alike, or leave the field "
                              "out with fields=[...]")
