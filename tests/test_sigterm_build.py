"""SIGTERM (what spot machines, Kubernetes and `kill` send) stops `shardkit build`/`dedup` cleanly:
one line, exit 143, cluster closed (no leaked semaphores), lock released; a rerun continues and
gives the bytes of a clean build."""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import tree_bytes

BIN = Path(sys.executable).parent
LINE = "stopped by SIGTERM: rerun the same command to continue"


def _corpus(root: Path, files: int = 6, lines: int = 3000) -> Path:
    """A jsonl corpus: text work runs on worker processes (a fork server, semaphores to leak)."""
    rng = random.Random(0)
    vocab = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    root.mkdir()
    for f in range(files):
        with open(root / f"docs{f}.jsonl", "w") as fh:
            for _ in range(lines):
                fh.write(json.dumps({"text": " ".join(rng.choice(vocab) for _ in range(60))}) + "\n")
    return root


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell does for a job started with `&`


def _lock_is_free(out: Path) -> bool:
    path = out / ".shardkit" / "lock"
    if not path.exists():
        return True
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _stop_when(args: list[str], ready, ignore_sigint: bool) -> subprocess.CompletedProcess:
    """Run args, send SIGTERM once ready() (polled every 10 ms), or not at all when the command ends
    first."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ignore_sigint if ignore_sigint else None)
    while proc.poll() is None and not ready():
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    # communicate() waits for stderr to close, which is after every child holding it (the resource
    # tracker that reports leaked semaphores, the fork server) has gone too.
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _moment(out: Path, k: int):
    """A moment of a build told by what it has written, not by the clock (a loaded machine stretches
    the clock, not the order): k = 0 once it holds OUT's lock, 1 once it has listed SRC (its scan
    state), k > 1 once k - 1 shards are done (their markers)."""
    state = out / ".shardkit"
    if k == 0:
        return lambda: (state / "lock").exists()
    if k == 1:
        return lambda: any((state / "scan").glob("*.json"))
    return lambda: len(list((state / "done").glob("shard-*.json"))) >= k - 1


def test_sigterm_at_random_moments_of_a_build(tmp_path):
    src = _corpus(tmp_path / "raw", files=4, lines=2000)
    opts = ["--workers", "2", "--max-samples-per-shard", "500", "--unit-samples", "100", "--format", "both",
            "--no-progress"]
    clean = subprocess.run([str(BIN / "shardkit"), "build", src, tmp_path / "clean", *opts],
                           capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    expected = tree_bytes(tmp_path / "clean")
    shards = len(list((tmp_path / "clean" / "shards").glob("*.tar")))
    assert shards == 16
    rng = random.Random(28)
    moments = [0, 1] + rng.sample(range(2, shards - 2), 3)  # each run is stopped at one of these
    stopped = 0
    for i, k in enumerate(moments):
        out = tmp_path / f"out{i}"
        args = [str(BIN / "shardkit"), "build", str(src), str(out), *opts]
        run = _stop_when(args, _moment(out, k), ignore_sigint=i % 2 == 1)
        if run.returncode == 0:  # finished between the moment and the signal
            assert run.stderr == ""
        else:
            stopped += 1
            assert run.returncode == 143, (k, run.stderr)
            assert run.stderr.splitlines() == [LINE], (k, run.stderr)  # no leaked semaphores, no traceback
            assert not (out / "manifest.json").exists()
        assert _lock_is_free(out)
        rerun = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        assert tree_bytes(out) == expected, k
    assert stopped >= 4  # a moment with 3+ shards left to write ends in the stop


def test_sigterm_stops_dedup_cleanly(tmp_path):
    src = _corpus(tmp_path / "raw", files=4, lines=2000)
    out = tmp_path / "dedup"
    args = [str(BIN / "shardkit"), "dedup", str(src), str(out), "--workers", "2", "--no-progress"]
    run = _stop_when(args, _moment(out, 0), ignore_sigint=True)
    if run.returncode != 0:
        assert run.returncode == 143, run.stderr
        assert run.stderr.splitlines() == [LINE], run.stderr
    assert _lock_is_free(out)
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads((out / "manifest.json").read_text())["samples"] == 8000 - json.loads(
        (out / "dedup" / "summary.json").read_text())["removed"]


def test_the_handler_is_restored_after_a_command(tmp_path):
    """The CLI's SIGTERM handler lives only while a command runs (CliRunner runs it in this process)."""
    from click.testing import CliRunner

    from shardkit.cli import main

    before = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "missing")])
    assert result.exit_code != 0
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_in_python_code_becomes_terminated():
    """In the main thread, the handler raises Terminated, a KeyboardInterrupt (Ctrl-C's clean-up paths)."""
    from shardkit.cli import stop_on_sigterm
    from shardkit.errors import Terminated

    with pytest.raises(Terminated) as caught:
        with stop_on_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert isinstance(caught.value, KeyboardInterrupt) and caught.value.name == "SIGTERM"
