"""autotune_batch_size: the largest batch that fits, by OOM search on CUDA or a memory budget on CPU."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from shardkit.errors import ConfigError
from shardkit.train.smoke import classification_loss

log = logging.getLogger("shardkit.train")


@dataclass
class TuneResult:
    """The batch size to use (limit x margin), the largest that fit, and every size tried."""

    batch_size: int
    largest_fit: int
    method: str
    tried: dict = field(default_factory=dict)  # batch size -> fitted (CUDA) or bytes needed (CPU)


def search_largest(fits, max_batch: int, start: int = 1) -> int:
    """Largest n in [start, max_batch] with fits(n) (fits monotone): doubling, then bisection; 0 if none."""
    lo, n = 0, start
    while n <= max_batch and fits(n):
        lo, n = n, n * 2
    hi = min(n, max_batch + 1)  # the first size known not to fit (or past the cap)
    if lo == 0:
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _cuda_fits(model, make_batch, loss_fn, tried: dict):
    import torch

    def fits(n: int) -> bool:
        try:
            loss_fn(model, make_batch(n)).backward()
            ok = True
        except torch.OutOfMemoryError:
            ok = False
        finally:
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()  # hand the failed attempt's blocks back before the next one
        tried[n] = ok
        return ok

    return fits


def step_bytes(model, batch, loss_fn) -> int:
    """Bytes one forward/backward holds: tensors saved for backward plus the batch's tensors."""
    import torch

    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model, batch)
    loss.backward()
    model.zero_grad(set_to_none=True)
    tensors = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    inputs = sum(t.untyped_storage().nbytes() for t in tensors if hasattr(t, "untyped_storage"))
    return sum(seen.values()) + inputs


def _cpu_largest(model, make_batch, loss_fn, budget: int, max_batch: int, tried: dict) -> int:
    # Activation memory grows linearly with the batch: measure two sizes, solve for the budget.
    n0 = max(1, min(8, max_batch // 2))
    for n in (n0, 2 * n0):
        tried[n] = step_bytes(model, make_batch(n), loss_fn)
    per_sample = max(1, (tried[2 * n0] - tried[n0]) // n0)
    base = tried[n0] - per_sample * n0
    # Parameters and their gradients (optimizer state is the caller's to leave room for).
    fixed = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    return max(0, min(max_batch, (budget - fixed - base) // per_sample))


def available_memory() -> int:
    """MemAvailable from /proc/meminfo in bytes (Linux); raises ConfigError elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    raise ConfigError("cannot read available memory here: pass memory_budget=<bytes> to autotune_batch_size")


def autotune_batch_size(model, make_batch, *, device="cpu", loss_fn=classification_loss, max_batch: int = 4096,
                        margin: float = 0.9, memory_budget: int | None = None) -> TuneResult:
    """Largest batch (x margin) for which a forward/backward fits.

    make_batch(n) returns a batch of n samples on `device`. CUDA: doubling then bisection on
    torch.OutOfMemoryError. CPU: a linear memory model measured at two sizes against
    `memory_budget` bytes (default: half of the available memory).
    """
    if not 0 < margin <= 1:
        raise ConfigError(f"margin={margin!r}: expected a fraction in (0, 1], e.g. 0.9 keeps 10% headroom")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ConfigError(f"max_batch={max_batch!r}: expected a positive integer")
    tried: dict = {}
    if str(device).startswith("cuda"):
        largest, method = search_largest(_cuda_fits(model, make_batch, loss_fn, tried), max_batch), "cuda-oom-search"
    else:
        budget = memory_budget if memory_budget is not None else available_memory() // 2
        largest, method = _cpu_largest(model, make_batch, loss_fn, budget, max_batch, tried), "cpu-memory-budget"
    if largest < 1:
        raise ConfigError(f"not even a batch of 1 fits ({method}, tried {tried}): use a smaller model or images, "
                          "or raise memory_budget")
    result = TuneResult(max(1, int(largest * margin)), largest, method, tried)
    log.info("autotune: batch %d (largest fit %d, %s)", result.batch_size, largest, method)
    return result
