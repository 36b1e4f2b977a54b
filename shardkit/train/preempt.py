"""PreemptionGuard: stop signals (SIGTERM from a spot machine or Kubernetes, SLURM's pre-timeout
signal) become a flag the training loop reads between steps, so it can finish the step, save a
checkpoint with the loader's state and exit inside the grace period, instead of dying mid-step."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from shardkit.errors import ConfigError

DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")  # SIGUSR1: what `sbatch --signal=USR1@120` sends before the time limit


def _signal_number(name) -> int:
    if isinstance(name, int):
        return name
    try:
        return int(signal.Signals[name if str(name).startswith("SIG") else f"SIG{name}"])
    except KeyError:
        raise ConfigError(f"PreemptionGuard(signals=...): unknown signal {name!r}; expected names such as "
                          "'SIGTERM', 'SIGUSR1' (SLURM: sbatch --signal=USR1@120)") from None


class PreemptionGuard:
    """Catch stop signals for the duration of a `with` block and let the loop stop between steps.

        with PreemptionGuard() as guard:              # SIGTERM and SIGUSR1 by default
            for batch in loader:
                step += 1; ...                          # the current step always finishes
                if guard.stop_requested:
                    save_checkpoint(ckpt_dir, {"model": model, "loader": loader, ...}, step=step)
                    guard.exit(f"checkpoint at step {step}")   # message + exit status 128 + signal

    A second signal while stopping changes nothing (the platform's SIGKILL ends the grace period
    anyway). A signal sent to the whole process group (a VM shutting down) does not kill
    make_loader's workers mid-batch: they leave a signal this process handles to it
    (shardkit.loader.signals), whether the guard was entered before or after they started. Enter it
    in the main thread: only that thread receives signals in Python.
    """

    def __init__(self, signals=DEFAULT_SIGNALS):
        self.signals = tuple(_signal_number(s) for s in signals)
        if not self.signals:
            raise ConfigError("PreemptionGuard(signals=()): name at least one signal, e.g. ('SIGTERM',)")
        self.received: int | None = None
        self.received_at: float | None = None
        self._previous: dict[int, object] = {}
        self._pid = None

    @property
    def stop_requested(self) -> bool:
        """True once one of the signals arrived: finish this step, save, and exit."""
        return self.received is not None

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.received).name if self.received is not None else None

    def _handle(self, signum, frame) -> None:
        if os.getpid() != self._pid:  # a DataLoader worker forked under the guard: its loop stops it
            return
        # Nothing else here (no logging: its locks are not safe to take in a handler); a signal
        # after the first leaves the first one named.
        if self.received is None:
            self.received, self.received_at = signum, time.monotonic()

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError("PreemptionGuard: enter it in the main thread (only that thread receives signals)")
        self._pid = os.getpid()
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def seconds_since_signal(self) -> float | None:
        return None if self.received_at is None else time.monotonic() - self.received_at

    def exit(self, what: str = "") -> None:
        """Print one line on stderr and exit with 128 + the signal (143 for SIGTERM), what a shell
        reports for a process the signal ended: a scheduler sees the run as stopped, not done."""
        took = self.seconds_since_signal() or 0.0
        detail = f": {what}" if what else ""
        print(f"stopped by {self.signal_name}{detail} ({took:.1f} s after the signal); rerun the same "
              "command to continue", file=sys.stderr, flush=True)
        raise SystemExit(128 + (self.received or signal.SIGTERM))
