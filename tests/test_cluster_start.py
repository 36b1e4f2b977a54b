"""The cluster's start: the one reader of multiprocessing's private fork-server state, its paths and fallback."""

import multiprocessing
import subprocess
import sys
import textwrap
from multiprocessing import forkserver

import pytest

from shardkit.jobs import cluster, pool


def _recorded_preload(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", lambda mods: calls.append(list(mods)))
    return calls


def test_preload_before_the_fork_server_starts(monkeypatch):
    monkeypatch.setattr(forkserver._forkserver, "_forkserver_pid", None)
    calls = _recorded_preload(monkeypatch)
    assert cluster.forkserver_started() is False
    assert cluster._preload_forkserver() == "preloaded"
    assert calls == [cluster.FORKSERVER_PRELOAD]


def test_a_running_fork_server_keeps_its_modules(monkeypatch):
    monkeypatch.setattr(forkserver._forkserver, "_forkserver_pid", 12345)
    calls = _recorded_preload(monkeypatch)
    assert cluster.forkserver_started() is True
    assert cluster._preload_forkserver() == "running"
    assert calls == []


def test_fallback_when_the_private_server_object_is_gone(monkeypatch):
    monkeypatch.delattr(forkserver, "_forkserver")
    calls = _recorded_preload(monkeypatch)
    assert cluster.forkserver_started() is None
    assert cluster._preload_forkserver() == "preloaded-unknown"
    assert calls == [cluster.FORKSERVER_PRELOAD]


def test_fallback_when_the_private_pid_attribute_is_gone(monkeypatch):
    monkeypatch.setattr(forkserver, "_forkserver", object())
    calls = _recorded_preload(monkeypatch)
    assert cluster.forkserver_started() is None
    assert cluster._preload_forkserver() == "preloaded-unknown"
    assert calls == [cluster.FORKSERVER_PRELOAD]


def test_the_private_state_follows_a_real_fork_server():
    """On this Python the private name exists and tells a started server from none (a fresh process)."""
    code = textwrap.dedent("""
        from multiprocessing import forkserver
        from shardkit.jobs.cluster import forkserver_started
        before = forkserver_started()
        forkserver.ensure_running()
        print(before, forkserver_started())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "True"]


def _never():
    raise AssertionError("the probe ran where the choice needs no measurement")


def test_auto_pool_picks_threads_only_below_the_measured_gil_cap():
    # 20% of 5 ms under the GIL caps threads near 1,000 images/s: above 2 cores (400/s x 2),
    # below 16 (3,200/s): the 16-core case, where threads used 4.7 of 16 cores.
    probe = lambda: (0.2, 0.005)  # noqa: E731
    two, sixteen = pool.choose_pool("auto", True, 2, probe), pool.choose_pool("auto", True, 16, probe)
    assert two.threads and not sixteen.threads
    assert "threads cap near 1,000 images/s against 400/s for 2 cores" in two.reason
    assert sixteen.reason.startswith("worker processes: one image takes 5.0 ms, 20% of it holding the GIL")
    assert not pool.choose_pool("auto", True, 2, lambda: (0.3, 0.005)).threads  # 2 x 2 x 0.3 > 1
    assert not pool.choose_pool("auto", False, 16, _never).threads  # text holds the GIL: unprobed
    assert pool.choose_pool("auto", True, 1, _never).threads  # one worker shares the GIL with no one
    assert pool.choose_pool("threads", False, 16, _never).threads
    assert not pool.choose_pool("processes", True, 2, _never).threads


def _busy(ms=3.0):
    import time

    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def test_gil_share_tells_work_holding_the_gil_from_work_releasing_it():
    """A busy loop holds the GIL all the time, a sleep none of it. Other load on a 2-core machine
    starves the worker thread now and then (the probe then runs alone): best of three tries."""
    import time

    tries = []
    for _ in range(3):
        held, seconds = pool.gil_share_median(_busy, seconds=0.2)
        free, _ = pool.gil_share_median(lambda: time.sleep(0.003), seconds=0.2)
        tries.append((held, free, seconds))
        if held > 0.6 and free < 0.2 and 0.002 < seconds < 0.1:
            break
    else:
        raise AssertionError(f"(held, free, seconds per call) of each try: {tries}")


def test_debug_says_which_pool_and_why(tmp_path, monkeypatch):
    import logging

    from click.testing import CliRunner

    import shardkit.jobs.build.probe as executor
    from shardkit.cli import main
    from shardkit.demo.datagen import image_folder

    image_folder(str(tmp_path / "raw"), n=6, classes=2, size=(64, 48))
    monkeypatch.setattr(executor, "probe", lambda cfg, listing: (0.1, 0.004))
    monkeypatch.setattr(cluster, "worker_log_level", cluster.worker_log_level)
    logger = logging.getLogger("shardkit")
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    monkeypatch.setattr(logger, "level", logger.level)
    run = CliRunner().invoke(main, ["--debug", "build", str(tmp_path / "raw"), str(tmp_path / "out"),
                                                    "--workers", "2", "--image-size", "32", "--no-progress"])
    assert run.exit_code == 0, run.output + run.stderr
    assert "shardkit.build: worker pool: threads: one image takes 4.0 ms, 10% of it holding the GIL" in run.stderr
    quiet = CliRunner().invoke(main, ["build", str(tmp_path / "raw"), str(tmp_path / "o2"),
                                                      "--workers", "0", "--image-size", "32", "--no-progress"])
    assert quiet.exit_code == 0 and "worker pool" not in quiet.stderr


def test_a_stop_hides_dask_teardown_errors_only_in_the_command(monkeypatch):
    """On Ctrl-C/SIGTERM inside the embedded cluster, what Dask logs while it is torn down mid-operation
    is dropped when the shardkit command runs (quiet_on_stop), and kept for a library caller."""
    import logging

    handler = logging.StreamHandler()
    dask_logger = logging.getLogger("distributed")
    monkeypatch.setattr(dask_logger, "handlers", [handler])
    record = logging.LogRecord("distributed.core", logging.ERROR, __file__, 1, "Exception while handling op", (), None)
    monkeypatch.setattr(cluster, "worker_log_level", logging.ERROR)  # as without --debug (a test before may have set it)
    monkeypatch.delenv("SHARDKIT_DEBUG", raising=False)
    for quiet in (False, True):
        monkeypatch.setattr(cluster, "quiet_on_stop", quiet)
        with pytest.raises(KeyboardInterrupt):
            with cluster._stop_quietly():
                raise KeyboardInterrupt
        assert bool(handler.filter(record)) is (not quiet)


def test_the_sigterm_handler_silences_dask_before_the_stop_begins(monkeypatch):
    """The embedded cluster may live in a background thread, out of the stop's exception path: the
    shardkit command's SIGTERM handler drops Dask's records itself, before raising Terminated."""
    import logging
    import signal

    from shardkit import cli
    from shardkit.errors import Terminated

    handler = logging.StreamHandler()
    monkeypatch.setattr(logging.getLogger("distributed"), "handlers", [handler])
    monkeypatch.setattr(cluster, "worker_log_level", logging.ERROR)
    monkeypatch.setattr(cluster, "quiet_on_stop", True)
    monkeypatch.delenv("SHARDKIT_DEBUG", raising=False)
    monkeypatch.setitem(cli._COMMAND, "over", False)
    record = logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 1, "Removing worker", (), None)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(Terminated):
            cli._on_sigterm(signal.SIGTERM, None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not handler.filter(record)


@pytest.mark.parametrize("name", ["asyncio", "tornado.application"])
def test_a_stop_drops_the_event_loops_tracebacks_too(monkeypatch, name):
    """A SIGTERM as the workers come up can cut the client's scatter: asyncio (or tornado) then logs the
    task's exception with its traceback on its own logger, which reaches the screen through the root
    logger's handlers. The stop drops those records as it drops Dask's."""
    import logging

    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger(name)
    monkeypatch.setattr(logger, "filters", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [Catch()])
    monkeypatch.setattr(logging.getLogger("distributed"), "handlers", [])
    monkeypatch.setattr(cluster, "worker_log_level", logging.ERROR)
    monkeypatch.delenv("SHARDKIT_DEBUG", raising=False)
    logger.error("before the stop")
    monkeypatch.setattr(cluster, "quiet_on_stop", True)
    cluster.silence_for_stop()
    logger.error("Task exception was never retrieved")
    assert seen == ["before the stop"]


def test_worker_processes_see_store_credentials_exported_after_the_fork_server_started(monkeypatch):
    """The fork server keeps the environment of its start; a key exported since reaches the workers
    all the same (a notebook that sets AWS_ACCESS_KEY_ID between two builds)."""
    import os

    from shardkit.jobs.cluster import dask_client

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first-key")
    with dask_client(None, 2) as client:  # starts the fork server (if not yet)
        assert set(client.run(os.environ.get, "AWS_ACCESS_KEY_ID").values()) == {"first-key"}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second-key")
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    with dask_client(None, 2) as client:
        seen = client.run(lambda: (os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("SHARDKIT_OBJECT_CLIENT")))
    assert set(seen.values()) == {("second-key", "fsspec")}
