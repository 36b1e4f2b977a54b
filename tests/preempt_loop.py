"""README's PreemptionGuard loop over make_loader(num_workers=2), for tests/test_preempt_workers.py.

    python preempt_loop.py DATA RUN --context fork|spawn --guard before|after [--steps N] [--delay S]

Appends one JSON line per step to RUN/trace.jsonl ({"step", "keys"}) and a {"start": step} line per
process; a stop signal saves RUN/ckpt and exits 128 + signal. `--guard before` enters the guard before
the loader exists, `after` once its workers are running.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("run")
    ap.add_argument("--context", default="fork")
    ap.add_argument("--guard", default="before")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--init-marker", default=None)  # a user's worker_init_fn writes here
    a = ap.parse_args()

    from shardkit import StreamingDataset, make_loader
    from shardkit.train import PreemptionGuard, load_checkpoint, save_checkpoint

    ckpt = os.path.join(a.run, "ckpt")
    guard = PreemptionGuard(("SIGTERM", "SIGUSR1"))
    stack = contextlib.ExitStack()
    if a.guard == "before":
        stack.enter_context(guard)
    ds = StreamingDataset(a.data, seed=3)
    loader = make_loader(ds, batch_size=4, num_workers=2, multiprocessing_context=a.context)
    if a.init_marker:
        loader.worker_init_fn = WorkerInit(a.init_marker)
    found = load_checkpoint(ckpt, {"loader": loader})
    step = found.step if found else 0
    trace = open(os.path.join(a.run, "trace.jsonl"), "a")
    trace.write(json.dumps({"start": step}) + "\n")
    trace.flush()
    with stack:
        while step < a.steps:
            for batch in loader:
                if a.guard == "after" and not guard._previous:  # the workers run: now the guard
                    stack.enter_context(guard)
                step += 1
                time.sleep(a.delay)  # the training step
                trace.write(json.dumps({"step": step, "keys": batch["__key__"]}) + "\n")
                trace.flush()
                if guard.stop_requested:
                    save_checkpoint(ckpt, {"loader": loader}, step=step, epoch=ds.epoch)
                    guard.exit(f"step {step} saved")
                if step >= a.steps:
                    break
    print("done", step, flush=True)


class WorkerInit:
    """A user's worker_init_fn: it must still run, and the loader must still be preemption-safe."""

    def __init__(self, marker: str):
        self.marker = marker

    def __call__(self, worker_id: int) -> None:
        with open(f"{self.marker}.{worker_id}", "w") as f:
            f.write(str(os.getpid()))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
