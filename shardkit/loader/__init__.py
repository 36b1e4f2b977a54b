"""make_loader: a DataLoader over StreamingDataset with batches built in workers and resumable state."""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import threading

from torch.utils.data import DataLoader

from shardkit.errors import ConfigError, from_worker
from shardkit.identity import local_world_size, usable_cores
from shardkit.loader import signals
from shardkit.loader.decode_ahead import DecodeAhead
from shardkit.loader.gpu_decode import BatchDecoder, choose
from shardkit.loader.stream import BatchStream
from shardkit.loader.transport import SlotTransport
from shardkit.reader import spans
from shardkit.reader.base import EpochDataset, check_state_shape
from shardkit.reader.partition import batch_sizes, num_batches

STATE_VERSION = 2


class StreamingLoader(DataLoader):
    """DataLoader whose workers yield whole batches, in the rank's order for any worker count.

    Progress is (seed, epoch, resume layers, samples consumed) in the dataset's position;
    `state_dict()` saves it and `load_state_dict()` on a fresh loader continues with exactly the
    samples not yet yielded, at any world size and number of workers. A new `iter()` after a
    finished epoch starts the next epoch, unless set_epoch() chose one; after a `break` it
    continues the epoch. `source` is the StreamingDataset or Mixture (left as it was given);
    `dataset` is what DataLoader iterates (its batches, built in the workers).
    """

    def __init__(self, dataset: EpochDataset, *, batch_size: int, drop_last: bool, num_workers: int,
                 prefetch_factor: int, pin_memory: bool, multiprocessing_context=None, gpu_decoder=None):
        self.source = dataset
        self.warming = None  # the first iteration's warm-up thread (EpochDataset.warm_up), if any
        # prefetch_factor counts batches; a worker item may hold several (packed token rows).
        group = dataset.group_size(batch_size)
        prefetch_factor = prefetch_factor if group == 1 else max(2, -(-prefetch_factor // group))
        gpu_decode = BatchDecoder(gpu_decoder) if gpu_decoder is not None else None
        # decode="nvjpeg": a decode thread takes the Encoded columns after unpacking (loader/decode_ahead.py)
        self._ahead = DecodeAhead(gpu_decoder) if hasattr(gpu_decoder, "scope") else None
        if self._ahead is not None:
            gpu_decode = _encoded
        self._transport = SlotTransport(num_workers, _slots(dataset, num_workers, prefetch_factor),
                                        pin=pin_memory, gpu_decode=gpu_decode) if num_workers else None
        # batch_size=None: the stream already yields batches; in_order keeps the round-robin
        # over workers that makes the batch order independent of num_workers. With workers,
        # the transport pins while copying out of the slots, so DataLoader's pin thread is off.
        super().__init__(BatchStream(dataset, batch_size, drop_last, self._transport), batch_size=None,
                         num_workers=num_workers, pin_memory=pin_memory and not num_workers,
                         prefetch_factor=prefetch_factor if num_workers else None,
                         persistent_workers=num_workers > 0, in_order=True,
                         multiprocessing_context=multiprocessing_context if num_workers else None)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return num_batches(len(self.source), self.dataset.batch_size, self.dataset.drop_last)

    def _plan(self):
        pos = self.source.position
        return self.source.epoch_plan(pos.epoch, pos.layers)

    def __iter__(self):
        if getattr(self, "_closed", False):
            raise RuntimeError("this loader was closed (loader.close()): make a new one with make_loader(...) and "
                               "load_state_dict(old.state_dict()) to continue where it stopped")
        pos = self.source.position
        left = num_batches(len(self._plan()) - pos.consumed, self.dataset.batch_size, self.dataset.drop_last)
        if left <= 0 and not pos.pinned:
            # The epoch ran out (or nothing of it was left; with drop_last, less than a batch): the next one.
            pos.jump(pos.epoch + 1)
        pos.pinned = False
        pos.publish()
        sizes = batch_sizes(len(self._plan()) - pos.consumed, self.dataset.batch_size, self.dataset.drop_last)
        if self._transport is None:
            return self._count(super().__iter__(), sizes, (pos.epoch, pos.layers))
        self._transport.new_iteration()
        # The (persistent) workers start on the first iteration, with the stop signals blocked (loader/signals.py)
        fresh = self._iterator is None
        starting = signals.blocked(self._start_method()) if fresh else contextlib.nullcontext()
        with starting:
            batches = super().__iter__()  # returns once the workers dropped the previous iteration
        if fresh and hasattr(self.source, "warm_up"):
            # The workers were just started (forked: no thread of ours was running then) and take a
            # while to reach their first batch: meanwhile this process fetches what it reads first.
            self.warming = self.source.warm_up(self.dataset.batch_size, self.dataset.drop_last, self.num_workers)
        self._transport.reclaim()
        return self._count(batches, sizes, (pos.epoch, pos.layers))

    def _get_iterator(self):
        iterator = super()._get_iterator()
        return _feeders_joined(iterator) if self.num_workers else iterator

    def close(self) -> None:
        """Stop the workers and let go of their shared slots now: they are persistent (they keep their
        open shards and caches from one epoch to the next) and otherwise live until the loader is
        garbage collected. The loader is done: to read on, make a new one (make_loader) and give it
        this one's state_dict(). Batches already received stay valid."""
        stop_workers(self)
        self._closed, self._transport = True, None  # the slots go with the last batch that holds them

    def _start_method(self) -> str:
        import multiprocessing

        ctx = self.multiprocessing_context  # None: the platform's default context
        return (ctx or multiprocessing.get_context()).get_start_method()

    def _unpack(self, item):
        """A worker's item as the main process reads it: its spans handed to the meter's trace, then
        out of its slot (or as pickled)."""
        if spans.ON:  # the worker's spans of this item go to the meter's trace; unpacking is the main's
            item = spans.received(item)
        with spans.main("unpack"):
            return self._transport.unpack(item) if self._transport is not None else item

    def _count(self, items, sizes: list[int], where: tuple):
        ds, pos, j = self.source, self.source.position, 0
        unpacked = (self._unpack(item) for item in _unwrapped(items))
        if self._ahead is not None:  # decoded on the decode thread, one batch ahead of this loop
            unpacked = self._ahead.run(unpacked)
        for item in unpacked:
            # A worker item is one batch, or a group of consecutive batches (packed token rows).
            for batch in ds.received(item):
                if j >= len(sizes) or (pos.epoch, pos.layers) != where:
                    raise RuntimeError(f"loader got batch {j} of epoch {where[0]}, expected {len(sizes)} batches "
                                       f"of epoch {pos.epoch}: set_epoch() was called during an epoch")
                # Count the planned size (not len(batch)): a skipped shard must not shift resume.
                ds.yielded(batch, sizes[j])
                pos.advance(sizes[j])
                j += 1
                yield batch

    def state_dict(self) -> dict:
        """Small and elastic: O(resumes at a new world size), independent of num_workers and batch_size."""
        ds, pos = self.source, self.source.position
        return {"version": STATE_VERSION, "seed": ds.config.seed, **ds.plan_fields(), "epoch": pos.epoch,
                "layers": [list(layer) for layer in pos.layers], "world_size": ds.world_size,
                "consumed": pos.consumed, "samples_per_rank": len(self._plan()), **ds.state_extra()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position (call before iterating), at this run's world size."""
        ds = self.source
        epoch, layers, consumed = _check_state(state, ds)
        if state["world_size"] != ds.world_size:
            # What the old ranks had not yet yielded becomes this epoch's stream for the new ones.
            layers, consumed = layers + ((state["world_size"], consumed),), 0
        ds.position.jump(epoch, consumed, layers)

    def proportions(self) -> dict | None:
        """A mixture's observed and target share of every source in what this loader yielded
        (Mixture.proportions); None for a single dataset."""
        report = getattr(self.source, "proportions", None)
        return report() if report is not None else None


def _encoded(enc):
    """The transport's decode step for decode="nvjpeg": images stay encoded for the decode thread."""
    return enc


def _unwrapped(items):
    """A worker's shardkit error as the worker raised it (errors.from_worker): its one line, not
    torch's wrapper around the worker's traceback."""
    try:
        yield from items
    except Exception as e:
        clean = from_worker(e)
        if clean is None:
            raise
        raise clean from None


def _check_state(state: dict, ds: EpochDataset) -> tuple[int, tuple, int]:
    """(epoch, layers, consumed) of a saved state, checked against this dataset."""
    check_state_shape(state)  # None or garbage: a ConfigError, not an AttributeError
    version = state.get("version")
    if version not in (1, STATE_VERSION):
        raise ConfigError(f"loader state version {version!r}; this shardkit reads 1 and {STATE_VERSION}")
    if state["seed"] != ds.config.seed:
        raise ConfigError(f"loader state was saved with seed={state['seed']}, this dataset has "
                          f"seed={ds.config.seed}: build the dataset with the same seed to resume")
    epoch, consumed, per_rank = state["epoch"], state["consumed"], state["samples_per_rank"]
    if version == 1 and 0 < consumed < per_rank:  # an older epoch order: only its boundaries carry over
        raise ConfigError(f"loader state from an older shardkit is {consumed} samples into an epoch; its "
                          "order differs from this version's: resume from an epoch boundary")
    ds.check_state(state)
    ours = ds.plan_fields()
    changed = {k: (state[k], ours[k]) for k in ours if k in state and state[k] != ours[k]}
    if changed:
        raise ConfigError("loader state was saved with another dataset or order: "
                          + ", ".join(f"{k}={a!r} then, {b!r} now" for k, (a, b) in changed.items())
                          + "; resume with the same dataset and StreamingDataset options")
    layers = tuple((int(w), int(c)) for w, c in state.get("layers", ()))
    saved = ds.epoch_plan(epoch, layers, world_size=state["world_size"])
    if len(saved) != per_rank or not 0 <= consumed <= per_rank:
        raise ConfigError(f"loader state is {consumed} of {per_rank} samples per rank over "
                          f"{state['world_size']} ranks, which this dataset does not give: was it saved "
                          "with another dataset?")
    return epoch, layers, consumed


def _slots(dataset: EpochDataset, num_workers: int, prefetch_factor: int) -> int:
    """Per tensor that fills a slot (images, fixed-shape rows: raw images, token rows, arrays):
    every batch DataLoader can have in flight, plus a few the training loop still holds; beyond
    that a worker falls back to DataLoader's own (slower) path."""
    return (prefetch_factor * num_workers + 4) * max(1, dataset.slotted_fields())


def default_workers(cores: int | None = None, local_ranks: int | None = None) -> int:
    """This rank's fair share of the machine's cores (cores / ranks on the machine, LOCAL_WORLD_SIZE
    under torchrun), at most 8. One rank alone leaves a core to its training loop; with several
    ranks (16 cores, 8 ranks: 2 workers each) each loop mostly waits on its GPU."""
    cores = usable_cores() if cores is None else cores
    local_ranks = local_world_size() if local_ranks is None else local_ranks
    share = cores // local_ranks if local_ranks > 1 else cores - 1
    return max(1, min(8, share))


START_METHODS = (None, "fork", "spawn", "forkserver")


def stop_workers(loader: DataLoader) -> None:
    """Stop a DataLoader's persistent workers now (a shardkit loader: use its close(), which also lets
    go of the workers' slots and refuses to iterate again). torch has no public call for this: its private
    `_shutdown_workers` where present, else the iterator is dropped and its finalizer stops them
    (tests/test_loader.py checks the workers are gone either way)."""
    iterator, loader._iterator = getattr(loader, "_iterator", None), None
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    del iterator
    gc.collect()


def _feeders_joined(iterator):
    """`iterator` (torch's, over worker processes) made to wait, once its shutdown closed the index
    queues, for each queue's feeder thread. Left to itself, a feeder thread can hold a queue's last
    reference and free its semaphores as the interpreter exits: a daemon thread stopped between
    unlinking a semaphore and telling multiprocessing's resource tracker, which then warns of a
    "leaked semaphore" on the user's screen (spawn and forkserver workers)."""
    cls = type(iterator)
    if not hasattr(cls, "_shutdown_workers"):  # a torch without it: its iterator as it is
        return iterator
    if cls not in _JOINING:
        # Bound now: an iterator freed while the interpreter tears its modules down finds them emptied.
        def shutdown_and_join(self, timeout: float = 2.0, finalizing=sys.is_finalizing,
                              current=threading.current_thread) -> None:
            cls._shutdown_workers(self)
            if finalizing():  # torch's shutdown returned early too; threads are being stopped
                return
            for q in getattr(self, "_index_queues", ()):
                feeder = getattr(q, "_thread", None)
                # Only a closed queue's thread ends on its own, and soon.
                if getattr(q, "_closed", False) and feeder is not None and feeder is not current():
                    feeder.join(timeout)

        _JOINING[cls] = type(cls.__name__, (cls,), {"_shutdown_workers": shutdown_and_join})
    iterator.__class__ = _JOINING[cls]
    return iterator


_JOINING: dict[type, type] = {}  # torch's iterator class -> the same, joining its feeder threads


def _check_workers(num_workers, prefetch_factor, multiprocessing_context) -> None:
    """ConfigError naming make_loader's worker option that holds no usable value."""
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"num_workers={num_workers!r}: expected 0 (main process) or more")
    if not isinstance(prefetch_factor, int) or prefetch_factor < 1:
        raise ConfigError(f"prefetch_factor={prefetch_factor!r}: expected a positive integer (batches per worker)")
    if isinstance(multiprocessing_context, str) or multiprocessing_context is None:
        if multiprocessing_context not in START_METHODS:
            raise ConfigError(f"multiprocessing_context={multiprocessing_context!r}: expected one of "
                              "'fork', 'spawn', 'forkserver' or None (the platform's default)")


def _pin_memory(pin_memory: bool | None) -> bool:
    """make_loader's pin_memory: None means pinned when CUDA is present; True without CUDA warns, and is off."""
    import torch

    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    elif pin_memory and not torch.cuda.is_available():
        # Pinned host memory needs a CUDA runtime; DataLoader would warn and skip it too.
        logging.getLogger(__name__).warning("pin_memory=True ignored: CUDA is not available")
        pin_memory = False
    return pin_memory


def make_loader(dataset: EpochDataset, *, batch_size: int, num_workers: int | None = None,
                prefetch_factor: int = 4, pin_memory: bool | None = None, drop_last: bool = False,
                multiprocessing_context: str | None = None, decode: str = "cpu") -> StreamingLoader:
    """A ready loader: one tensor per field per batch plus '__key__' (list of str; packed token rows
    only with keys=True), persistent workers, prefetch, pinned memory when CUDA is present, and
    state_dict/load_state_dict.

    `multiprocessing_context` starts the workers ("spawn" is macOS's default and what some CUDA
    set-ups need; None: the platform's default). `decode="cuda"`: workers ship images encoded and
    the main process decodes each batch on the GPU (nvJPEG, `shardkit[gpu]`), giving CUDA tensors;
    without torchvision or CUDA, or with num_workers=0, the workers decode on the CPU as by default
    (one warning line). `decode="nvjpeg"`: the same, decoded by nvImageCodec (the GPU's hardware
    JPEG engine, `shardkit[gpu-cu12]` / `[gpu-cu13]`) on a thread of its own, one batch ahead of
    the loop; images of another size are resized and center-cropped on the GPU to the batch's most
    common size; a ConfigError where it cannot run. `decode="auto"`: nvImageCodec, else
    torchvision, else the CPU workers (the path taken: shardkit.loader.memory.PATHS["decode"]).
    The dataset is left as given."""
    if not isinstance(dataset, EpochDataset):
        raise ConfigError(f"make_loader needs a shardkit StreamingDataset or Mixture, got {type(dataset).__name__}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ConfigError(f"batch_size={batch_size!r}: expected a positive integer")
    dataset.check_loader(batch_size, drop_last)
    if num_workers is None:
        num_workers = default_workers()
    _check_workers(num_workers, prefetch_factor, multiprocessing_context)
    gpu_decoder = choose(decode, num_workers)
    if gpu_decoder is not None and (getattr(dataset, "transform", None) or getattr(dataset, "batch_transform", None)):
        raise ConfigError(f"decode={decode!r} decodes images after the workers, so the dataset's transform / "
                          "batch_transform would see encoded bytes: apply it to the GPU batch in the training "
                          "loop, or use decode='cpu'")
    return StreamingLoader(dataset, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers,
                           prefetch_factor=prefetch_factor, pin_memory=_pin_memory(pin_memory),
                           multiprocessing_context=multiprocessing_context, gpu_decoder=gpu_decoder)
