"""EarlyStopping: stop when a validation metric has not improved for `patience` evaluations."""

from __future__ import annotations

import math

from shardkit.errors import ConfigError

MODES = ("min", "max")


class EarlyStopping:
    """`stop = early(val_loss)` after each evaluation; improvement must beat `min_delta`."""

    def __init__(self, patience: int = 3, min_delta: float = 0.0, mode: str = "min"):
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
            raise ConfigError(f"patience={patience!r}: expected a positive number of evaluations (--patience)")
        if not min_delta >= 0:
            raise ConfigError(f"min_delta={min_delta!r}: expected a number >= 0 (--min-delta)")
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r}: expected 'min' (losses) or 'max' (accuracies)")
        self.patience, self.min_delta, self.mode = patience, float(min_delta), mode
        self.best: float | None = None
        self.best_step: int | None = None
        self.bad = 0  # evaluations since the last improvement
        self.evaluations = 0

    def improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def __call__(self, value: float, step: int | None = None) -> bool:
        """Record one evaluation; True when training should stop. A NaN counts as no improvement."""
        value = float(value)
        self.evaluations += 1
        if not math.isnan(value) and self.improved(value):
            self.best, self.best_step, self.bad = value, step, 0
        else:
            self.bad += 1
        return self.should_stop

    @property
    def should_stop(self) -> bool:
        return self.bad >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad": self.bad, "evaluations": self.evaluations}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_step = state["best"], state["best_step"]
        self.bad, self.evaluations = state["bad"], state["evaluations"]
