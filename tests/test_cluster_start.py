"""The cluster's start: the one reader of multiprocessing's private fork-server state, its paths and fallback."""

import multiprocessing
import subprocess
import sys
import textwrap
from multiprocessing import forkserver

from shardkit import cluster


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
        from shardkit.cluster import forkserver_started
        before = forkserver_started()
        forkserver.ensure_running()
        print(before, forkserver_started())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "True"]
