"""Mixed precision for the device at hand, and an optimizer step with gradient accumulation."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from shardkit.errors import ConfigError

PRECISIONS = ("auto", "bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Precision:
    """A resolved precision: 'bf16', 'fp16' or 'fp32' on a device type ('cpu' or 'cuda')."""

    name: str
    device_type: str

    def __post_init__(self):
        if self.name not in PRECISIONS[1:]:
            raise ConfigError(f"precision {self.name!r}: expected one of {', '.join(PRECISIONS[1:])}")
        if self.device_type not in ("cpu", "cuda"):
            raise ConfigError(f"device type {self.device_type!r}: expected 'cpu' or 'cuda'")

    @property
    def dtype(self):
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.name]

    @property
    def needs_scaler(self) -> bool:
        # fp16 has 5 exponent bits: small gradients underflow unless the loss is scaled up first.
        return self.name == "fp16"


def choose_precision(device="cpu", precision: str = "auto", *, capability: tuple[int, int] | None = None) -> Precision:
    """bf16 on CPU and on CUDA compute capability >= 8.0 (Ampere+), fp16 on older CUDA; or as asked.

    `capability` overrides the queried (major, minor) of the CUDA device, for tests and planning.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r}: expected one of {', '.join(PRECISIONS)} (--precision)")
    device_type = str(device).split(":", 1)[0]
    if precision != "auto":
        return Precision(precision, device_type)
    if device_type == "cpu":
        return Precision("bf16", "cpu")
    if capability is None:
        import torch

        capability = torch.cuda.get_device_capability(device)
    return Precision("bf16" if capability[0] >= 8 else "fp16", device_type)


def autocast(precision: Precision):
    """torch.autocast for bf16/fp16; a no-op context for fp32 (bit-exact, reproducible runs)."""
    if precision.name == "fp32":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=precision.device_type, dtype=precision.dtype)


def make_scaler(precision: Precision):
    """A torch.amp.GradScaler for fp16, else None (bf16 and fp32 need no loss scaling)."""
    if not precision.needs_scaler:
        return None
    import torch

    return torch.amp.GradScaler(precision.device_type)


class AccumulationStep:
    """Backward on each micro-batch loss; an optimizer step every `accum_steps` micro-batches.

    The loss is divided by accum_steps so the summed gradients equal those of one big batch of
    mean-reduced loss. With a GradScaler the loss is scaled, gradients unscaled before clipping,
    and a step whose gradients hold inf/NaN is skipped (counted in `skipped_steps`). Given a
    DistributedDataParallel `ddp_model`, micro-batches before the last skip the all-reduce.
    """

    def __init__(self, optimizer, *, accum_steps: int = 1, scaler=None, clip_grad_norm: float | None = None,
                 ddp_model=None):
        if not isinstance(accum_steps, int) or isinstance(accum_steps, bool) or accum_steps < 1:
            raise ConfigError(f"accum_steps={accum_steps!r}: expected a positive integer (--accum-steps)")
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ConfigError(f"clip_grad_norm={clip_grad_norm!r}: expected a positive number or None")
        self.optimizer, self.scaler, self.ddp_model = optimizer, scaler, ddp_model
        self.accum_steps, self.clip_grad_norm = accum_steps, clip_grad_norm
        self.micro = 0  # micro-batches since the last optimizer step
        self.optimizer_steps = 0
        self.skipped_steps = 0

    def __call__(self, loss) -> bool:
        """Backward one micro-batch loss; True when this call ended in an optimizer step."""
        loss = loss / self.accum_steps
        last = self.micro + 1 == self.accum_steps
        # Gradients are all-reduced once per optimizer step, on the last micro-batch only.
        sync = contextlib.nullcontext() if last or self.ddp_model is None else self.ddp_model.no_sync()
        with sync:
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        self.micro += 1
        if self.micro < self.accum_steps:
            return False
        self.step()
        return True

    def step(self) -> None:
        """Apply the accumulated gradients now (also used to flush a partial accumulation)."""
        import torch

        opt, scaler = self.optimizer, self.scaler
        if self.clip_grad_norm is not None:
            if scaler is not None:
                scaler.unscale_(opt)  # clip the true gradients, not the scaled ones
            params = [p for group in opt.param_groups for p in group["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
        if scaler is not None:
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            # GradScaler lowers its scale exactly when it skipped the step for inf/NaN gradients.
            self.skipped_steps += scaler.get_scale() < before
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        self.micro = 0
        self.optimizer_steps += 1

    def state_dict(self) -> dict:
        return {"micro": self.micro, "optimizer_steps": self.optimizer_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.micro = state["micro"]
        self.optimizer_steps, self.skipped_steps = state["optimizer_steps"], state["skipped_steps"]
