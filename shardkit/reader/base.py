"""What every streamed dataset shares (one dataset, or a mixture of several): progress through the
epoch, a worker's batches from the published position, and the hooks make_loader calls."""

from __future__ import annotations

import copy
import itertools
import threading

import numpy as np
import numpy.ma  # noqa: F401 — see below
import torch
from torch.utils.data import IterableDataset

from shardkit.contract import fixed_nbytes
from shardkit.errors import ConfigError
from shardkit.identity import worker_identity, worker_info
from shardkit.reader import decode, spans
from shardkit.reader.partition import Plan, locate
from shardkit.reader.position import Position
from shardkit.reader.tokens import STORED

# numpy.ma above: np.unique (a shuffle's blocks, a batch's rows) imports it on its first call, 14 ms
# of CPU. Imported here, in the process that forks the loader's workers, no worker pays it on its
# first batch (traced: bench/RESULTS.md, "The first remote batch, taken apart").

# Packed token rows per DataLoader item: a worker builds this many rows (several consecutive batches)
# at once, because each item costs ~100-200 us of DataLoader and transport work in the main process
# (measured), which at 16 rows a batch was more than reading them. 512 rows (8.4 MB of int64) measured
# 10% faster than 256 and than 1,024 at B=64 (bench/token_loader_bench.py).
GROUP_ROWS = 512


class StateContract:
    """The state contract of an EpochDataset: what the loader saves besides the position, and its
    check on restore."""

    def plan_fields(self) -> dict:
        """What fixes an epoch's order, saved in the loader's state and compared key by key on restore."""
        raise NotImplementedError

    def state_extra(self) -> dict:
        """What the state holds besides (what the data is: digests, a mixture's source positions);
        checked by check_state."""
        return {}

    def check_state(self, state: dict) -> None:
        """Raise a ConfigError when a saved loader state cannot resume this dataset."""


class Progress:
    """Where an EpochDataset stands in its epochs: read from, and moved through, its `position`."""

    @property
    def padding(self) -> int:
        """Samples repeated (or, with drop_remainder, dropped) over all ranks by the current
        epoch's split (after a resume at another world size: by the rest of this epoch)."""
        p = self.position
        return self.epoch_plan(p.epoch, p.layers).padding

    @property
    def epoch(self) -> int:
        return self.position.epoch

    @property
    def consumed(self) -> int:
        """Samples of this epoch already yielded to the training loop (kept up by make_loader)."""
        return self.position.consumed

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` (a new order); the same epoch again keeps a restored position.

        Without set_epoch, make_loader moves to the next epoch when one has run out.
        """
        self.position.set_epoch(epoch)

    def restart(self, epoch: int = 0) -> None:
        """Go to the first sample of `epoch`, whatever was consumed (e.g. a validation pass)."""
        self.position.jump(epoch)


class ReaderCounts:
    """What an EpochDataset's `reader` counted in every worker: shards and samples skipped, network figures."""

    @property
    def skipped_shards(self) -> list[str]:
        """Paths of shards skipped as unreadable under on_error='skip' (seen by any worker)."""
        return self.reader.skipped_shards

    def io_stats(self) -> dict:
        """Network figures of every worker since the dataset was made (or reset_io_stats()):
        bytes_fetched, files_fetched (shards and indexes downloaded into the cache) and
        network_wait_s (seconds readers waited for a remote shard, summed over workers) and
        fetch_cpu_s (CPU seconds the remote path took: GETs, writes into the cache, checks)."""
        return self.reader.remote.stats()

    def reset_io_stats(self) -> None:
        self.reader.remote.net.reset()

    @property
    def skipped_samples(self) -> int:
        """Samples left out under on_error='skip' because their bytes failed the checksum (all workers)."""
        return int(self.reader.skipped.sum())


class EpochDataset(IterableDataset, StateContract, Progress, ReaderCounts):
    """An IterableDataset read in epochs: exactly-once over ranks x workers, resumable.

    The contract a subclass fills, and nothing more: it sets `config` (StreamConfig), `reader`
    (BatchReader), `tokens` (TokenBatches or None), `fields` and `field_specs`, `transform`,
    `batch_transform`, `rank`, `world_size` and `position` (Position), and gives `epoch_plan`,
    `__len__` and `plan_fields` (what fixes the order: saved in the loader's state and compared on
    restore); `state_extra` / `check_state` add what tells one dataset from another. The plan's
    options and the slots a batch fills follow from those here. Two hooks only a mixture needs (`check_loader`, `yielded`)
    do nothing unless overridden. The state contract's defaults, the epoch progress and the reader's
    counts are in StateContract, Progress and ReaderCounts.
    """

    position: Position

    def epoch_plan(self, epoch: int, layers=(), batch_size: int = 1, drop_last: bool = False,
                   world_size: int | None = None):
        """This rank's plan of `epoch` after resume `layers` (rank 0's at another `world_size`)."""
        raise NotImplementedError

    @property
    def plan(self) -> Plan:
        """The epoch layout these options give (one sample per batch)."""
        c = self.config
        return Plan(seed=c.seed, shuffle=c.shuffle, shuffle_buffer=c.shuffle_buffer, drop_remainder=c.drop_remainder)

    def slotted_fields(self) -> int:
        """Tensors per batch that fill reusable shared slots in make_loader's workers (images,
        fixed-shape rows, arrays, token fields)."""
        return slotted_fields(self.field_specs, self.fields, self.tokens)

    # -- hooks only a mixture needs

    def check_loader(self, batch_size: int, drop_last: bool) -> None:
        """Raise a ConfigError when make_loader's batching does not fit this dataset."""

    def yielded(self, batch, size: int) -> None:
        """Main process: `batch` (`size` planned samples) is about to reach the training loop."""

    def batches(self, batch_size: int, drop_last: bool = False, transport=None):
        """This worker's batches from the published position: {'__key__': [str], field: tensor or
        list}. With make_loader's `transport` batch memory comes from its shared slots, and packed
        token rows come as groups of consecutive batches (cut again by `received`)."""
        if worker_info() is not None:
            decode.tune_worker_malloc()
        epoch, consumed, layers = self.position.published()
        worker, num_workers = worker_identity()
        group = self.group_size(batch_size, transport is not None)
        plan = self.epoch_plan(epoch, layers, group * batch_size, drop_last and group == 1)
        # Groups of consecutive batches, still dealt round-robin: the same order; a dropped last
        # batch is cut off before grouping.
        stop = consumed + (len(plan) - consumed) // batch_size * batch_size if group > 1 and drop_last else None
        # Grouped items: each worker's first is one batch, so the first batch does not wait for a group.
        lead = batch_size if group > 1 else 0
        # Packed rows widen into pinned memory in the main process, untransformed.
        cross = group > 1 or (self.transform is None and self.batch_transform is None)
        cross = cross and getattr(transport, "pin", False)
        alloc = transport.alloc if transport is not None else None
        remote = self.reader.remote

        def walk(p):
            return p.batches(consumed, worker, num_workers, stop, lead)

        # The remote side walks the same batches in a thread (what to fetch, when a shard is done),
        # on a copy of the plan: its order caches shuffle blocks, which two threads must not share.
        remote.start(lambda: walk(copy.deepcopy(plan)), (len(plan) - consumed) // max(1, num_workers))
        try:
            for j, ids in enumerate(walk(plan)):
                batch = self.load(ids, epoch, alloc, cross)
                yield dict(batch, __batches__=_sizes(len(ids), batch_size)) if group > 1 else batch
                for s in remote.finished(j):
                    self.reader.close(s)
        finally:
            remote.stop()

    def warm_up(self, batch_size: int, drop_last: bool, num_workers: int):
        """Main process, once the loader's workers were started: fetch what their first batches read
        first (the index sidecars of those batches' remote shards) into the shared cache, in a
        thread, while the workers start up; they find it there. The thread, or None when nothing is
        remote. Best effort: a fetch that fails is the worker's to report, as it would be."""
        remote = self.reader.remote
        if not remote.remote or self.group_size(batch_size) > 1:
            return None
        epoch, consumed, layers = self.position.published()

        def firsts() -> None:
            # A copy, as the workers' walks take: a plan's order caches blocks, not for two threads.
            plan = copy.deepcopy(self.epoch_plan(epoch, layers, batch_size, drop_last))
            ids = list(itertools.islice(plan.batches(consumed, 0, 1), max(1, num_workers)))
            if ids:
                remote.warm(np.unique(locate(np.concatenate(ids), remote.offsets)[0]).tolist())

        thread = threading.Thread(target=firsts, name="shardkit-warm-up", daemon=True)
        thread.start()
        return thread

    def group_size(self, batch_size: int, transport: bool = True) -> int:
        """Batches a worker builds per item: several for packed token rows sent through the loader's
        transport untransformed (see GROUP_ROWS), one otherwise (under on_error='skip' a batch may
        come out short)."""
        packed = self.tokens is not None and self.tokens.packed
        plain = transport and self.transform is None and self.batch_transform is None
        if not packed or not plain or self.config.on_error != "fail":
            return 1
        return max(1, GROUP_ROWS // batch_size)

    def load(self, ids: np.ndarray, epoch: int, alloc=None, cross: bool = False) -> dict:
        """The batch of global sample ids `ids` as shown in `epoch`, transforms applied."""
        if alloc is None or self.transform is not None:  # a transform rebuilds the batch
            alloc = decode.np_empty
        # input_ids and labels as two views of one array only where no transform may edit one in place.
        plain = self.transform is None and self.batch_transform is None
        batch = self.reader.read(ids, epoch, alloc, cross, shared=plain)
        if self.transform is not None:
            with spans.within("transforms"):
                samples = [self.transform(decode.unbatch(batch, i)) for i in range(length(batch))]
            with spans.within("collate"):
                batch = decode.collate(samples)
        if self.batch_transform:
            with spans.within("transforms"):
                return self.batch_transform(batch)
        return batch

    def received(self, item):
        """Main process: the batches of one worker item. A group of consecutive batches (packed token
        rows) is cut into views; rows that crossed as stored are widened here into pinned memory."""
        if not isinstance(item, dict) or ("__batches__" not in item and STORED not in item):
            yield item
            return
        sizes = item.pop("__batches__", None) or [length(item)]
        for part in self.tokens.cut(item, sizes):
            yield self.tokens.finish(part, _pinned, shared=False) if STORED in part else part

    def __iter__(self):
        """One decoded sample at a time (a plain DataLoader batches them itself)."""
        epoch, consumed, layers = self.position.published()
        worker, num_workers = worker_identity()
        plan, remote = self.epoch_plan(epoch, layers), self.reader.remote
        remote.start(lambda: copy.deepcopy(plan).batches(consumed, worker, num_workers),
                     (len(plan) - consumed) // max(1, num_workers))
        try:
            for j, ids in enumerate(plan.batches(consumed, worker, num_workers)):
                batch = self.reader.read(ids, epoch)
                for i in range(length(batch)):
                    sample = decode.unbatch(batch, i)
                    yield self.transform(sample) if self.transform else sample
                for s in remote.finished(j):
                    self.reader.close(s)
        finally:
            remote.stop()


def _pinned(shape) -> np.ndarray:
    return torch.empty(shape, dtype=torch.uint8, pin_memory=True).numpy()


def _sizes(n: int, batch_size: int) -> list[int]:
    return [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])


def length(batch: dict) -> int:
    """Samples in a batch (keys may be left out)."""
    if "__key__" in batch:
        return len(batch["__key__"])
    return len(next(iter(batch.values())))


STATE_KEYS = ("version", "seed", "epoch", "consumed", "samples_per_rank", "world_size")


def check_state_shape(state) -> None:
    """A loader state is the dict `loader.state_dict()` returned: anything else (None, a whole
    checkpoint, a damaged file) is a ConfigError saying what was given and what is expected."""
    if not isinstance(state, dict):
        raise ConfigError(f"load_state_dict({type(state).__name__}): expected the dict loader.state_dict() returned "
                          "(for a checkpoint file, pass its loader entry, e.g. shardkit.train.load_checkpoint)")
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise ConfigError(f"load_state_dict: the state lacks {missing} (it has {sorted(map(str, state))[:12]}); "
                          "expected the dict loader.state_dict() returned")
    bad = [k for k in STATE_KEYS[1:] if not isinstance(state[k], int) or isinstance(state[k], bool)]
    if bad:
        raise ConfigError(f"load_state_dict: {', '.join(f'{k}={state[k]!r}' for k in bad)} should be integers; "
                          "the state is damaged: load it from an earlier checkpoint")


def shards_digest(counts) -> str:
    """The shard layout in a few bytes, saved in the loader state: the order permutes shards, so the
    same total cut into other shards (a rebuild with another shard size) gives another order.
    O(shards) once per call."""
    import xxhash

    return f"{len(counts)} shards, counts {xxhash.xxh3_64_hexdigest(np.ascontiguousarray(counts, '<i8').tobytes())}"


def slotted_fields(specs: dict, fields: list[str], tokens) -> int:
    """Tensors per batch that fill reusable shared slots (images, fixed-shape rows, arrays, token fields)."""
    if tokens is not None and tokens.packed:
        return tokens.slots()
    read = [specs[f] for f in fields if tokens is None or f != "tokens"]
    fixed = sum(1 for spec in read if spec["kind"] == "image" or fixed_nbytes(spec) is not None)
    return fixed + (tokens.slots() if tokens is not None else 0)
