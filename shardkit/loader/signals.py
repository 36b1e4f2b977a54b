"""Stop signals in DataLoader workers: a signal sent to the whole process group (a VM shutting down,
a spot reclaim, `scancel`, Ctrl-C) must not kill the workers while the main process survives it to
finish its step and save a checkpoint.

torch installs its own SIGTERM handler in each worker (C, over anything inherited): it exits quietly
when the main process sent the signal (its `terminate()` at shutdown) and dies otherwise, so a group
SIGTERM killed the workers and the training step with them. Here each worker blocks the stop signals
in its main thread and a thread takes them (`sigtimedwait`, which tells who sent each one):

- from the main process: SIGTERM ends the worker quietly, as torch's handler does; another signal
  does what it would have done;
- from elsewhere: ignored while the main process catches or ignores that signal (its
  /proc/PID/status says so: a PreemptionGuard, the shardkit command, Python's own SIGINT handler),
  since the main process then stops the workers itself; else it does what it would have done
  (the main process dies of it too);
- the main process gone (killed with SIGKILL): the worker exits within POLL_SECONDS.

Workers are started with the signals blocked (`blocked()` around their start, inherited through fork
and spawn), so one arriving while a worker comes up waits for that thread instead of killing it.
Linux only (sigtimedwait, /proc); elsewhere workers keep torch's behaviour.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

# Signals a stop handler may catch: what schedulers send (SIGTERM; SLURM's --signal, often USR1/USR2),
# a closed terminal (SIGHUP) and Ctrl-C (SIGINT).
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2})
POLL_SECONDS = 1.0  # how soon a worker notices that the main process is gone
_taken = {"pid": None}  # the process whose stop signals a thread takes (a forked child must start its own)


def supported() -> bool:
    return hasattr(signal, "sigtimedwait") and os.path.isdir("/proc/self")


@contextlib.contextmanager
def blocked(start_method: str | None):
    """Block the stop signals in this thread while it starts worker processes with `start_method`:
    they start with them blocked. A signal for this process that arrives meanwhile is delivered when
    the block ends."""
    if not supported():
        yield
        return
    if start_method != "fork":
        from multiprocessing import resource_tracker

        # Started by the first spawned process otherwise, inside the block, and its start unblocks
        # SIGINT and SIGTERM in this thread (it blocks them for its own child, then unblocks them).
        resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def take_in_worker(main_pid: int) -> None:
    """In a DataLoader worker (once per process): the stop signals go to a thread that decides."""
    if _taken["pid"] == os.getpid() or not supported():
        return
    _taken["pid"] = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # threads started from here on inherit it
    threading.Thread(target=_take, args=(main_pid, os.getppid()), name="shardkit-stop-signals", daemon=True).start()


def _take(main_pid: int, parent: int) -> None:
    while True:
        info = _waited(signal.sigtimedwait(STOP_SIGNALS, POLL_SECONDS))
        if os.getppid() != parent:  # the main process (or fork server) is gone: nothing reads our batches
            os._exit(0)
        if info is None:
            continue
        if info.si_pid == main_pid and info.si_signo == signal.SIGTERM:
            os._exit(0)  # the loader ending this worker: quietly, as torch's handler does
        if info.si_pid != main_pid and outlives(main_pid, info.si_signo):
            continue  # the main process finishes its step and stops the workers itself
        _as_without_us(info.si_signo)


def _waited(info):
    """sigtimedwait's answer, None for none. CPython (3.11) answers with a siginfo it never filled when
    the wait was interrupted (EINTR: the worker was stopped, then continued) after its timeout had
    passed: a signal number out of range, which raised in this thread. Only a stop signal is one."""
    return info if info is not None and info.si_signo in STOP_SIGNALS else None


def outlives(pid: int, signum: int) -> bool:
    """Whether process `pid` catches or ignores `signum`, so that it goes on after a signal sent to
    its whole process group (False if it is gone or cannot be read)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        state, caught, ignored = status["State"].split()[0], int(status["SigCgt"], 16), int(status["SigIgn"], 16)
    except (OSError, KeyError, ValueError, IndexError):
        return False
    return state not in ("Z", "X") and bool((caught | ignored) >> (signum - 1) & 1)


def _as_without_us(signum: int) -> None:
    """What `signum` would have done to this worker: delivered to this thread alone (unblocked here for
    the moment), so the process's handler for it runs, or its default action (for SIGTERM, torch's
    handler: the process dies of it)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    try:
        signal.pthread_kill(threading.get_ident(), signum)
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signum])
