"""Host memory for loader slots: shared storages, page-locking, storage use counts.

Each private or CUDA-only torch API the slots rely on sits behind one function here, with a
public fallback, and `PATHS` records which path each one took last in this process (tests read
it; so can a user wondering why batches are copied).
"""

from __future__ import annotations

import logging
import sys

import torch

log = logging.getLogger(__name__)

# Which path each fenced API took last in this process: "private" / "public" / "none", with why.
PATHS: dict[str, str] = {}


def new_shared(nbytes: int):
    """A shared-memory storage of nbytes: straight into shared memory where this torch has the
    private constructor `UntypedStorage._new_shared`, else through the public share_memory_(),
    which first fills private memory and copies it over (3.4 vs 0.8 ms for an 8 MB slot)."""
    new = getattr(torch.UntypedStorage, "_new_shared", None)
    if new is not None:
        PATHS["new_shared"] = "private"
        return new(nbytes)
    PATHS["new_shared"] = "public"
    return torch.UntypedStorage(nbytes).share_memory_()


# A use-count function -> whether it counts as expected. Keyed by the function itself, not its
# id: holding it keeps a replaced one's id from being reused by another with a stale verdict.
_PROBED: dict = {}


def use_count_fn():
    """torch's count of a storage's users (the private `torch._C._storage_Use_Count`), or None
    where this torch lacks it or it does not count as expected: a wrong count would reuse a slot
    under a live tensor, so it is checked once (a new storage, then one more tensor over it)."""
    fn = getattr(torch._C, "_storage_Use_Count", None)
    if fn is None:
        PATHS["use_count"] = "none: torch._C._storage_Use_Count is missing"
        return None
    if fn not in _PROBED:
        _PROBED[fn] = _counts_users(fn)
    if not _PROBED[fn]:
        PATHS["use_count"] = "none: torch._C._storage_Use_Count miscounts"
        return None
    PATHS["use_count"] = "private"
    return fn


def _counts_users(fn) -> bool:
    try:
        storage = torch.UntypedStorage(1)
        alone = fn(storage._cdata)
        view = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (1,))
        shared = fn(storage._cdata)
        del view
        return isinstance(alone, int) and shared == alone + 1 and fn(storage._cdata) == alone
    except (TypeError, RuntimeError, AttributeError):
        return False


def refs(t):
    """(Python references to t, tensors sharing its storage): equal to an unreferenced tensor's
    only when nothing else holds t, a view of it, or a numpy array over it. None: cannot tell."""
    count = use_count_fn()
    if count is None:
        return None
    return sys.getrefcount(t), count(t.untyped_storage()._cdata)


class PageLock:
    """A storage page-locked in place (cudaHostRegister) for as long as this object lives: a copy
    to the GPU from it is a DMA, as from torch's own pinned memory, with no copy on the host."""

    def __init__(self, storage, unregister):
        self.storage = storage  # the same object the transport holds: no extra storage user
        self._unregister = unregister  # kept: module globals may be gone when this is collected

    def __del__(self):
        self._unregister(self.storage.data_ptr())


def page_lock(storage) -> PageLock | None:
    """Page-lock a (shared-memory) storage in place; None where CUDA is absent or refuses, and
    the caller falls back to copying into torch-pinned memory."""
    ok, why = _register(storage.data_ptr(), storage.nbytes())
    PATHS["page_lock"] = "cudaHostRegister" if ok else f"none: {why}"
    if ok:
        return PageLock(storage, _unregister)
    if not getattr(page_lock, "warned", False):
        page_lock.warned = True  # one line per process, not one per slot
        log.warning("could not page-lock the loader's shared slots (%s): batches are copied into "
                    "pinned memory instead, which is slower", why)
    return None


def _register(ptr: int, nbytes: int) -> tuple[bool, str]:
    """cudaHostRegister(ptr, nbytes) through torch's cudart binding: (done, why not)."""
    if not torch.cuda.is_available():
        return False, "CUDA is not available"
    try:
        cudart = torch.cuda.cudart()
        err = cudart.cudaHostRegister(ptr, nbytes, 0)
        ok = err == cudart.cudaError.success
    except (AttributeError, RuntimeError, TypeError) as e:
        return False, f"torch.cuda.cudart().cudaHostRegister failed: {e}"
    return ok, "" if ok else f"cudaHostRegister returned {err}"


def _unregister(ptr: int) -> None:
    if not torch.cuda.is_initialized():  # never registered (or the process is shutting down)
        return
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except (AttributeError, RuntimeError, TypeError):  # interpreter shutdown: nothing to undo
        pass


def copy_fence():
    """An event on the current CUDA stream: once it completes, copies queued before it from a
    page-locked slot (`.to("cuda", non_blocking=True)`) are done and the slot may be refilled.
    Torch-pinned memory gets the same guard from torch's host allocator."""
    return torch.cuda.current_stream().record_event()


def pinned_empty(shape, stride, dtype, pin: bool):
    """An empty tensor for a copied batch: in torch-pinned memory when `pin`."""
    return torch.empty_strided(shape, stride, dtype=dtype, pin_memory=pin)


def pinned(t, pin: bool):
    """t in torch-pinned memory when `pin` (small tensors sent by value)."""
    return t.pin_memory() if pin else t
