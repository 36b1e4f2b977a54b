"""A stop signal sent to the whole process group (a VM shutting down, a spot reclaim, `scancel`) during
README's PreemptionGuard loop over make_loader(num_workers=2): the step finishes, a checkpoint is
written, exit 143, and the rerun continues with the batches an uninterrupted run gives; with fork and
spawn, the guard entered before or after the loader's workers started. Workers still end with the
main process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shardkit import ShardWriter

HERE = Path(__file__).resolve().parent
LOOP = HERE / "preempt_loop.py"
STEPS = 40  # 30 batches an epoch: the runs cross an epoch boundary
ENV = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("preempt")
    with ShardWriter(str(root / "data"), max_samples_per_shard=16) as w:
        for i in range(120):
            w.write({"__key__": f"s{i:04d}", "cls": i, "arr": np.full(8, i, np.float32)})
    full = root / "full"
    full.mkdir()
    done = subprocess.run([sys.executable, str(LOOP), str(root / "data"), str(full), "--steps", str(STEPS)],
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    (_, steps), = _trace(full)
    assert [s for s, _ in steps] == list(range(1, STEPS + 1))
    return root / "data", steps


def _trace(run: Path) -> list[tuple[int, list]]:
    """[(started at step, [(step, keys), ...]) per process]."""
    runs = []
    for line in (run / "trace.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "start" in rec:
            runs.append((rec["start"], []))
        else:
            runs[-1][1].append((rec["step"], rec["keys"]))
    return runs


def _start(data: Path, run: Path, *args: str) -> subprocess.Popen:
    run.mkdir(exist_ok=True)
    # Its own process group, as a job's: the signal goes to the group (killpg), workers included.
    return subprocess.Popen([sys.executable, str(LOOP), str(data), str(run), "--steps", str(STEPS), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)


def _wait_for_steps(proc: subprocess.Popen, run: Path, n: int) -> None:
    deadline = time.monotonic() + 180
    while not (run / "trace.jsonl").exists() or (run / "trace.jsonl").read_text().count('"step"') < n:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the loop made no progress"
        time.sleep(0.02)


def _worker_pids(marker: Path) -> list[int]:
    deadline = time.monotonic() + 60
    while True:
        found = [marker.parent / f"{marker.name}.{w}" for w in (0, 1)]
        if all(p.exists() and p.read_text() for p in found):
            return [int(p.read_text()) for p in found]
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" in f.read()
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("guard", ["before", "after"])
def test_sigterm_to_the_group_saves_the_step_and_the_rerun_continues(data, tmp_path, context, guard):
    src, full = data
    run = tmp_path / "run"
    marker = tmp_path / "init"
    proc = _start(src, run, "--context", context, "--guard", guard, "--delay", "0.15", "--init-marker", str(marker))
    try:
        _wait_for_steps(proc, run, 6)  # mid-epoch, workers running
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, err[-3000:]
    assert err.splitlines()[-1].startswith("stopped by SIGTERM: step ") and "Traceback" not in err, err[-3000:]
    assert all((tmp_path / f"init.{w}").exists() for w in (0, 1))  # a user's worker_init_fn still runs
    saved = sorted(p.name for p in (run / "ckpt").iterdir())
    (_, stopped), = _trace(run)
    assert saved == [f"step-{stopped[-1][0]:09d}.pt"] and stopped[-1][0] < STEPS

    rerun = subprocess.run([sys.executable, str(LOOP), str(src), str(run), "--steps", str(STEPS), "--context",
                            context], capture_output=True, text=True, timeout=300, env=ENV)
    assert rerun.returncode == 0 and f"done {STEPS}" in rerun.stdout, rerun.stderr[-3000:]
    (_, first), (resumed_at, second) = _trace(run)
    assert resumed_at == first[-1][0]
    assert first + second == full  # every batch once, in the uninterrupted order


def test_without_a_guard_the_group_signal_ends_main_process_and_workers(data, tmp_path):
    src, _ = data
    run = tmp_path / "run"
    proc = _start(src, run, "--guard", "none", "--delay", "0.1", "--init-marker", str(tmp_path / "init"))
    workers = _worker_pids(tmp_path / "init")
    _wait_for_steps(proc, run, 3)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in workers):
        assert time.monotonic() < deadline, "a worker outlived the SIGTERM that ended its main process"
        time.sleep(0.05)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_end_when_the_main_process_is_killed(data, tmp_path, context):
    src, _ = data
    run = tmp_path / "run"
    proc = _start(src, run, "--context", context, "--delay", "0.1", "--init-marker", str(tmp_path / "init"))
    workers = _worker_pids(tmp_path / "init")
    _wait_for_steps(proc, run, 3)
    proc.kill()  # SIGKILL to the main process alone
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in workers):
        assert time.monotonic() < deadline, "a worker outlived its main process"
        time.sleep(0.05)


def test_outlives_reads_what_a_process_does_with_a_signal():
    from shardkit.loader.signals import outlives

    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        assert outlives(os.getpid(), signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        assert outlives(os.getpid(), signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        assert not outlives(os.getpid(), signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert outlives(os.getpid(), signal.SIGINT)  # Python's own handler: Ctrl-C raises KeyboardInterrupt here
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not outlives(gone.pid, signal.SIGTERM)


def test_a_wait_answered_with_an_unfilled_siginfo_is_no_signal():
    """CPython returns an unfilled siginfo from sigtimedwait when the wait was interrupted after its
    timeout (a worker stopped and continued): its garbage signal number raised in the worker's
    stop-signal thread (seen when a stopped worker's main process closed the loader and exited: the
    orphaned worker was continued by the kernel, 2 runs in 3). Only a stop signal is one."""
    from shardkit.loader.signals import _waited

    garbage = signal.struct_siginfo((1647669736, 0, 0, 0, 0, 0, 0))
    term = signal.struct_siginfo((int(signal.SIGTERM), 0, 0, os.getpid(), 0, 0, 0))
    assert _waited(garbage) is None and _waited(None) is None and _waited(term) is term
