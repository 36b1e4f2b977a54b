"""PreemptionGuard: stop signals become a flag read between steps; exit says so and uses 128 + signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shardkit.errors import ConfigError
from shardkit.train import PreemptionGuard

ROOT = Path(__file__).resolve().parent.parent


def test_a_signal_sets_the_flag_and_the_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    with PreemptionGuard() as guard:
        assert not guard.stop_requested
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal: still stopping, the first one named
        assert guard.stop_requested and guard.signal_name == "SIGUSR1"
        assert guard.seconds_since_signal() >= 0
    assert {s: signal.getsignal(s) for s in before} == before


def test_signals_by_name_number_or_short_name():
    assert PreemptionGuard(("TERM", "SIGUSR2", int(signal.SIGHUP))).signals == (
        signal.SIGTERM, signal.SIGUSR2, signal.SIGHUP)
    with pytest.raises(ConfigError, match="unknown signal 'SIGNOPE'"):
        PreemptionGuard(("SIGNOPE",))
    with pytest.raises(ConfigError, match="at least one signal"):
        PreemptionGuard(())


def test_only_the_main_thread_can_enter_it():
    errors = []

    def enter():
        try:
            with PreemptionGuard():
                pass
        except ConfigError as e:
            errors.append(str(e))

    t = threading.Thread(target=enter)
    t.start()
    t.join()
    assert errors and "main thread" in errors[0]


def test_exit_prints_one_line_and_exits_128_plus_the_signal():
    script = ("import os, signal\nfrom shardkit.train import PreemptionGuard\n"
              "with PreemptionGuard() as g:\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    assert g.stop_requested\n"
              "    g.exit('step 7 saved to run/step-7.pt')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 143
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stopped by SIGTERM: step 7 saved to run/step-7.pt (")
    assert lines[0].endswith("rerun the same command to continue")


def test_a_recipe_rejects_an_unknown_stop_signal():
    from shardkit.recipes import Recipe

    assert Recipe("s", "d", "r", stop_signals="term, SIGUSR1").signals() == ("SIGTERM", "SIGUSR1")
    with pytest.raises(SystemExit, match="--stop-signals"):
        Recipe("s", "d", "r", stop_signals="SIGTERM,bogus")
