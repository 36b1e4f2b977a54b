"""Before a long run: a smoke test (shapes, NaNs, peak memory) and the largest batch that fits."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from shardkit.contract import IMAGE_FIELDS
from shardkit.errors import ConfigError

_SHAPE_ERROR = re.compile(r"shape|size mismatch|mat1 and mat2|must match the size|batch_size|channels", re.I)


def to_device(batch, device):
    """Move the tensors of a dict/tuple/list batch to `device`; other values (keys) stay."""
    if hasattr(batch, "to"):
        # non_blocking overlaps the copy with compute when the loader pinned the memory.
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def classification_loss(model, batch):
    """Cross-entropy of model(images / 255) against labels: a shardkit dict batch or (x, y)."""
    import torch.nn.functional as F

    if isinstance(batch, dict):
        name = next((f for f in IMAGE_FIELDS if f in batch), None)
        if name is None or "cls" not in batch:
            raise ConfigError(f"batch has fields {sorted(batch)}; classification_loss needs an image field "
                              f"({', '.join(IMAGE_FIELDS)}) and 'cls': pass loss_fn=... for other data")
        x, y = batch[name], batch["cls"]
    else:
        x, y = batch
    if not x.is_floating_point():
        x = x.float() / 255
    return F.cross_entropy(model(x), y)


def describe(batch) -> str:
    """'raw (8, 3, 32, 32) torch.uint8, cls (8,) torch.int64' - the tensors of a batch."""
    if isinstance(batch, dict):
        items = batch.items()
    else:
        items = enumerate(batch if isinstance(batch, (list, tuple)) else [batch])
    return ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in items if hasattr(v, "shape"))


@dataclass
class SmokeResult:
    """Outcome of smoke_test: ok, the problem kind ('data', 'shape', 'nan', 'error') and message."""

    ok: bool
    steps: int
    losses: list[float] = field(default_factory=list)
    problem: str | None = None
    message: str = ""
    batch: str = ""
    peak_memory_bytes: int = 0
    memory_source: str = ""

    def __bool__(self) -> bool:
        return self.ok


def _peak_memory(device) -> tuple[int, str]:
    if str(device).startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    import resource

    # ru_maxrss is in KiB on Linux: the process's high-water mark, not only this test's share.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process peak RSS"


def _bad_grads(model) -> list[str]:
    import torch

    return [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]


def _one_step(model, batch, loss_fn, i: int) -> tuple[float, str | None, str]:
    """(loss, problem, message) for one forward/backward; raises only for errors to classify."""
    loss = loss_fn(model, batch)
    value = float(loss.detach())
    if not math.isfinite(value):
        return value, "nan", f"loss is {value} at step {i}"
    loss.backward()
    bad = _bad_grads(model)
    if bad:
        return value, "nan", f"non-finite gradients at step {i} in {', '.join(bad[:5])}"
    return value, None, ""


def smoke_test(model, loader, *, loss_fn=classification_loss, steps: int = 2, device="cpu") -> SmokeResult:
    """Run `steps` forward/backward passes (no optimizer step) and report problems instead of raising."""
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    result, it, was_training = SmokeResult(ok=False, steps=0), iter(loader), model.training
    model.train()
    try:
        for i in range(steps):
            try:
                batch = to_device(next(it), device)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - reported to the user, who asked for a verdict
                result.problem, result.message = "data", f"loading batch {i} failed: {type(e).__name__}: {e}"
                return result
            result.batch = describe(batch)
            try:
                value, problem, message = _one_step(model, batch, loss_fn, i)
            except Exception as e:  # noqa: BLE001 - classified and returned, not swallowed
                kind = "shape" if isinstance(e, RuntimeError) and _SHAPE_ERROR.search(str(e)) else "error"
                result.problem, result.message = kind, f"step {i}: {type(e).__name__}: {e} (batch: {result.batch})"
                return result
            result.losses.append(value)
            if problem:
                result.problem, result.message = problem, message
                return result
            result.steps += 1
        result.ok = result.steps > 0
        if not result.ok:
            result.problem, result.message = "data", "the loader yielded no batch"
        return result
    finally:
        model.zero_grad(set_to_none=True)  # leave no gradients behind for the real run
        model.train(was_training)
        result.peak_memory_bytes, result.memory_source = _peak_memory(device)
