"""Shared-slot transport: worker batches reach the main process through reusable shared memory."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import torch

from shardkit.identity import worker_info
from shardkit.loader import memory
from shardkit.reader.decode import Encoded

SMALL_BYTES = 1 << 16  # tensors below this travel inside the pickled batch, by value


@dataclasses.dataclass
class SlotRef:
    """A batch tensor that lives in a worker's reusable shared-memory slot (storage sent once)."""

    pid: int
    worker: int
    slot: int
    version: int  # which storage the slot holds (it grows when a batch needs more bytes)
    storage: object  # that UntypedStorage until the main process has it, else None
    dtype: object
    shape: tuple
    stride: tuple
    offset: int


@dataclasses.dataclass
class Small:
    """A small tensor sent by value as a numpy array (no shared-memory segment, no fd passing)."""

    array: np.ndarray
    dtype: object  # the tensor's dtype: bfloat16 travels as int16 bits (numpy has no bfloat16)


class SlotTransport:
    """Moves batches from workers to the main process without a new shared-memory segment each.

    DataLoader's own path gives every batch tensor a fresh shared-memory segment and passes its
    file descriptor through the worker's resource-sharer thread: page faults on fresh shmem
    pages plus a GIL round trip cost ~10 ms per 10 MB batch here, more than reading it. Instead
    each worker decodes straight into one of its slots (a storage sent to the main process
    once) and sends only a SlotRef. The main process hands out a tensor over the slot and frees
    the slot through a shared flag once nothing refers to that tensor any more. With pin_memory
    it page-locks each slot in place once (memory.page_lock), so the tensor handed out is
    already pinned and `.to("cuda", non_blocking=True)` is a DMA from the slot; the slot is
    refilled only after the copies queued on the current stream are done. It hands out a copy
    instead (and frees the slot at once) when the slot could not be page-locked (the copy goes
    to torch-pinned memory), or when this torch cannot count a storage's users
    (memory.use_count_fn): a slot must never be reused under a tensor the training loop may
    still hold. A worker with no free slot falls back to DataLoader's own path.
    """

    def __init__(self, num_workers: int, slots: int, pin: bool = False, gpu_decode=None):
        # Per slot: 0 free, else the loader iteration (generation) whose batch occupies it.
        self.flags = torch.zeros((num_workers, slots), dtype=torch.int64).share_memory_()
        self.generation = torch.zeros(1, dtype=torch.int64).share_memory_()
        # The storage version the main process holds per slot: the worker attaches the storage to
        # a SlotRef until then (a batch dropped by an early stop never reached the main process).
        self.known = torch.zeros((num_workers, slots), dtype=torch.int64).share_memory_()
        self._versions = 0
        self._gen = 0  # worker side: the generation of the iteration being produced
        self.pin = pin
        # decode="cuda": workers ship images encoded (decode.images reads this through alloc's
        # __self__) and the main process decodes them with gpu_decode (a BatchDecoder).
        self.ship_encoded = gpu_decode is not None
        self._gpu_decode = gpu_decode
        self.copy_out = memory.use_count_fn() is None  # decided in the main process, which unpacks
        self._slots: dict[int, list] = {}  # worker side: slot -> [storage, nbytes, version, numpy view of it]
        self._pending: list[int] = []      # slots handed out for the batch being built
        self._main: dict[tuple, object] = {}  # main side: (pid, slot) -> storage
        self._lent: list[tuple] = []       # main side: (worker, slot, handle on the slot) while lent out
        self._locks: dict[tuple, object] = {}  # main side, pinning: (pid, slot) -> PageLock, or None: refused
        self._draining: list[tuple] = []   # main side: (worker, slot, fence) of page-locked slots let go
        self._baseline = None

    def __getstate__(self):
        return {"flags": self.flags, "generation": self.generation, "known": self.known, "_versions": 0,
                "_gen": 0, "pin": self.pin, "ship_encoded": self.ship_encoded, "_gpu_decode": None,
                "copy_out": self.copy_out, "_slots": {}, "_pending": [],
                "_main": {}, "_lent": [], "_locks": {}, "_draining": [], "_baseline": None}

    def new_iteration(self) -> None:
        """Main side, before DataLoader starts (or resets) an iteration."""
        self.generation += 1

    def start_iteration(self) -> None:
        """Worker side, when DataLoader hands it the next iteration (BatchStream.__iter__): slots
        it fills from now on belong to that generation.

        Counted here, not read from the shared `generation`: a worker may begin an iteration after
        the main process has already stopped it and started the next one (under load, 1 run in 8
        of the early-stop test). Reading the counter then tagged the stopped iteration's slots
        with the new generation, so reclaim() took them for live ones and they stayed taken for a
        whole extra epoch. Workers take up iterations one by one, in the order the main process
        started them, so the worker's own count is the iteration's generation."""
        self._gen += 1
        assert self._gen <= int(self.generation), "a worker ran ahead of the main process's iterations"

    def reclaim(self) -> int:
        """Main side, once DataLoader has drained the previous iteration: slots filled for
        batches that were never delivered (the loop stopped early) are free again. Slots lent
        out, or let go but waiting for their copy fence, are not: release() frees those."""
        lent = {(w, s) for w, s, _ in self._lent + self._draining}
        stale = (self.flags != 0) & (self.flags != int(self.generation))
        freed = 0
        for w, s in stale.nonzero().tolist():
            if (w, s) not in lent:
                self.flags[w, s] = 0
                freed += 1
        return freed

    def alloc(self, shape) -> np.ndarray:
        """A uint8 array of `shape` in a free slot (worker) or plain memory (main / no slot free)."""
        info = worker_info()
        n = int(np.prod(shape))
        if info is None:
            return np.empty(shape, np.uint8)
        flags = self.flags[info.id].numpy()  # numpy over the shared flags: ~50x cheaper per call than torch ops
        free = np.flatnonzero(flags == 0).tolist()
        if not free:
            return np.empty(shape, np.uint8)
        fits = [s for s in free if s in self._slots and self._slots[s][1] >= n]
        slot = fits[0] if fits else free[0]
        if not fits:  # allocate (or grow) once; reused for every later batch
            # Unique across worker processes too, in case DataLoader ever replaces one.
            self._versions = max(self._versions + 1, os.getpid() << 24)
            storage = memory.new_shared(max(n, 1))
            whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (max(n, 1),)).numpy()
            self._slots[slot] = [storage, max(n, 1), self._versions, whole]
        flags[slot] = self._gen
        self._pending.append(slot)
        return self._slots[slot][3][:n].reshape(shape)

    def pack(self, batch):
        """Worker side: the batch's slot tensors become SlotRefs, small tensors numpy arrays."""
        info = worker_info()
        if info is None:
            return batch
        # By address: a tensor made by torch.from_numpy over part of a slot has a storage of its own.
        spans = [(self._slots[s][0].data_ptr(), self._slots[s][1], s) for s in self._pending]
        pending, self._pending = self._pending, []
        if not isinstance(batch, dict):
            # DataLoader pickles (copies) it later, in the worker's queue feeder thread: the slots of
            # the tensors it holds stay taken until the next iteration's reclaim.
            _free(self.flags, info, set(pending) - _slots_in(batch, spans))
            return batch
        out, used = {}, set()
        for name, value in batch.items():
            if isinstance(value, torch.Tensor):
                slot = _slot_of(value, spans)
                if slot is not None:
                    out[name] = self._ref(info, slot, value)
                    used.add(slot)
                    continue
                if value.nbytes < SMALL_BYTES:
                    value = Small(_numpy(value), value.dtype)
            out[name] = value
        # Free: a batch_transform replaced those tensors. Taken: it put them in a list or dict, which
        # DataLoader pickles (copies) later, as a batch that is no dict.
        left = set(pending) - used
        if left:
            left -= _slots_in([v for v in batch.values() if not isinstance(v, torch.Tensor)], spans)
        _free(self.flags, info, left)
        return out

    def _ref(self, info, slot: int, value) -> SlotRef:
        storage, _, version, _ = self._slots[slot]
        attach = None if int(self.known[info.id, slot]) == version else storage
        offset = (value.data_ptr() - storage.data_ptr()) // value.element_size()
        return SlotRef(os.getpid(), info.id, slot, version, attach, value.dtype, tuple(value.shape),
                       tuple(value.stride()), offset)

    def unpack(self, batch):
        """Main side: tensors over the slots (copies when untracked, or pinned and not page-locked),
        small tensors rebuilt. Several tensors of a batch may lie in one slot (views of one array):
        the slot is freed once none of them is in use."""
        self.release()
        if not isinstance(batch, dict):
            return batch
        slots: dict = {}  # (worker, slot) -> (pid, slot) of this batch's tensors
        out = {name: self._tensor(value, slots) for name, value in batch.items()}
        for (worker, slot), key in slots.items():
            if not self._lends(key):
                self.flags[worker, slot] = 0  # copied: the worker may reuse the slot
            else:  # a private handle on the slot's storage: its use count tells when the user is done
                self._lent.append((worker, slot, torch.empty(0, dtype=torch.uint8).set_(self._main[key], 0, (0,))))
        return out

    def _lends(self, key) -> bool:
        """Whether the slot's own memory is handed out (else a copy of it)."""
        return not self.copy_out and (not self.pin or self._locks.get(key) is not None)

    def _tensor(self, value, slots: dict):
        if isinstance(value, Small):
            return memory.pinned(torch.from_numpy(value.array).view(value.dtype), self.pin)
        if isinstance(value, Encoded):
            return self._gpu_decode(value)
        if not isinstance(value, SlotRef):
            return value
        key = (value.pid, value.slot)
        if value.storage is not None:
            if self.pin and not self.copy_out:
                # Once per slot storage; a grown slot's old lock goes (unregistered) with the old storage.
                self._locks[key] = memory.page_lock(value.storage)
            self._main[key] = value.storage
            self.known[value.worker, value.slot] = value.version
        slots[(value.worker, value.slot)] = key
        view = torch.empty(0, dtype=value.dtype).set_(self._main[key], value.offset, value.shape, value.stride)
        if self._lends(key):
            return view
        dst = memory.pinned_empty(value.shape, value.stride, value.dtype, self.pin)
        # numpy, not Tensor.copy_: torch's intra-op threads would fight the workers (and the
        # training step) for the cores, which made this copy ~8x slower on 2 cores.
        np.copyto(_numpy(dst), _numpy(view))
        return dst

    def release(self) -> int:
        """Free the slots of lent tensors that nothing refers to any more; returns how many."""
        if self._baseline is None:  # what an unreferenced tensor looks like, measured the same way
            held = torch.UntypedStorage(1)  # held like the storages in self._main
            self._baseline = _scan([(0, 0, torch.empty(0, dtype=torch.uint8).set_(held, 0, (1,)))], None,
                                   probe=True)
        freed = _scan(self._lent, self._baseline)
        if self.pin:
            # Page-locked: a copy to the GPU queued from the slot may still be running; the slot
            # is refilled once the current stream has passed a fence recorded now.
            self._draining += [(worker, slot, memory.copy_fence()) for worker, slot, _ in freed]
        else:
            for worker, slot, _ in freed:
                self.flags[worker, slot] = 0
        self._lent = [e for e in self._lent if not any(e is f for f in freed)]
        done = [e for e in self._draining if e[2].query()]
        for worker, slot, _ in done:
            self.flags[worker, slot] = 0
        self._draining = [e for e in self._draining if not any(e is d for d in done)]
        return len(freed)


def _free(flags, info, slots) -> None:
    """Worker side: marks `slots` of worker info.id free in the shared flags."""
    if slots:
        flags[info.id].numpy()[sorted(slots)] = 0


def _scan(entries: list, baseline, probe: bool = False):
    """The lent entries (worker, slot, handle) whose slot storage nothing refers to any more: the
    handle's memory.refs equal `baseline`, an unreferenced tensor's. With `probe`, the first entry's
    memory.refs: the baseline, measured the same way (through an entry of a list, in this frame)."""
    freed = []
    for entry in entries:
        refs = memory.refs(entry[2])
        if probe:
            return refs
        if refs is not None and refs == baseline:
            freed.append(entry)
    return freed


_NUMPY_LACKS = {torch.bfloat16: torch.int16}


def _numpy(t) -> np.ndarray:
    """A numpy view of tensor t; dtypes numpy lacks are viewed as same-size integers."""
    return t.view(_NUMPY_LACKS.get(t.dtype, t.dtype)).numpy()


def _slot_of(tensor, spans: list):
    """The slot (of `spans`: start, nbytes, slot) whose memory holds the tensor's first byte, or None."""
    ptr = tensor.data_ptr()
    return next((s for lo, n, s in spans if lo <= ptr < lo + n), None)


def _slots_in(value, spans: list) -> set:
    """The slots (of `spans`) that tensors in a list, tuple or dict lie in."""
    found, stack = set(), [value]
    while stack and spans:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if (slot := _slot_of(v, spans)) is not None:
                found.add(slot)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return found
