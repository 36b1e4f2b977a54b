"""Every CLI failure is one line on stderr with a documented exit status; tasks that cannot pass are not retried."""

import errno
import subprocess
import sys

import pytest
from click.testing import CliRunner

from shardkit.cli import main


def one_line(result) -> str:
    err = result.stderr
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_disk_full_during_build_is_one_line_and_not_retried(raw_folder, tmp_path, monkeypatch):
    import shardkit.jobs.build.tasks as build_tasks

    calls = []

    def full_disk(fmt):
        def write(table, root, shard_id, fields, durable=True):
            calls.append(shard_id)
            raise OSError(errno.ENOSPC, "No space left on device", f"{root}/shards/data-{shard_id:05d}.tar")
        return write

    monkeypatch.setattr(build_tasks, "get_table_writer", full_disk)
    result = run("build", raw_folder, tmp_path / "out", "--workers", "0", "--no-progress")
    assert result.exit_code == 4
    err = one_line(result)
    assert "No space left on device" in err and "data-00000.tar" in err and "free space" in err
    assert calls == [0]


def test_dedup_into_itself(tmp_path):
    (tmp_path / "x").mkdir()
    result = run("dedup", tmp_path / "x", tmp_path / "x", "--workers", "0")
    assert result.exit_code == 1
    assert "is SRC: dedup writes a new dataset; choose another OUT folder" in one_line(result)


def test_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    for command in ("build", "dedup"):
        result = run(command, tmp_path / "empty", tmp_path / command, "--workers", "0", "--no-progress")
        assert result.exit_code == 1
        assert "holds no input shardkit can read" in one_line(result)
    result = run("build", tmp_path / "empty", tmp_path / "out", "--workers", "0", "--no-progress", "--allow-empty")
    assert result.exit_code == 0 and "samples written 0" in result.output
    result = run("dedup", tmp_path / "out", tmp_path / "dedup2", "--workers", "0", "--no-progress")
    assert result.exit_code == 1 and "this dataset is empty (0 samples, no shards)" in one_line(result)


def test_http_needs_no_extra(monkeypatch):
    """http(s) is read on shardkit's own connections (shardkit/store/http_ranges.py): no extra is missing,
    what fails is the store that is not there (a missing s3fs: test_store_urls)."""
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    result = run("inspect", "http://127.0.0.1:9/data")
    assert result.exit_code == 1 and "Connection refused" in one_line(result) and "pip install" not in one_line(result)


def test_a_bug_is_one_line_and_debug_shows_the_traceback(raw_folder, tmp_path, monkeypatch):
    import shardkit.jobs.build as executor

    def broken(cfg):
        raise KeyError("unexpected")

    monkeypatch.setattr(executor, "plan_shards", lambda *args: broken(args))
    result = run("build", raw_folder, tmp_path / "out", "--workers", "0", "--no-progress")
    assert result.exit_code == 70 and "internal error: KeyError: 'unexpected'" in one_line(result)
    assert "--debug" in result.stderr
    result = run("--debug", "build", raw_folder, tmp_path / "out", "--workers", "0", "--no-progress")
    assert isinstance(result.exception, KeyError)  # re-raised whole: click's runner keeps the traceback


def test_exit_codes_are_documented():
    result = run("--help")
    assert "3 OUT is being written by another build or dedup" in result.output
    assert "70 internal error" in result.output


def test_a_real_process_prints_one_line(tmp_path):
    (tmp_path / "x").mkdir()
    p = subprocess.run([sys.executable, "-m", "shardkit.cli", "dedup", str(tmp_path / "x"), str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: OUT")


# --- the task loop: no retry for errors that cannot pass ------------------------------------------

def _attempt(item, log):
    with open(log, "a") as f:
        f.write(f"{item}\n")
    if item == "full":
        raise OSError(errno.ENOSPC, "No space left on device", "/out/shards/data-00000.tar")
    if item == "flaky":
        raise RuntimeError("the worker's disk hiccupped")
    return item


@pytest.fixture(scope="module")
def client():
    import cloudpickle

    from shardkit.jobs.cluster import dask_client

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    with dask_client(None, 1) as c:
        yield c


@pytest.mark.parametrize("item,error,tries", [("full", OSError, 1), ("flaky", RuntimeError, 3)])
def test_run_tasks_retries_only_what_may_pass(client, tmp_path, item, error, tries):
    from shardkit.jobs.tasks import run_tasks

    log = tmp_path / "attempts"
    with pytest.raises(error) as caught:
        run_tasks(_attempt, [item], client=client, name=f"t-{item}", shared=(str(log),))
    assert log.read_text().splitlines() == [item] * tries
    if item == "full":
        assert caught.value.errno == errno.ENOSPC and caught.value.filename == "/out/shards/data-00000.tar"
    assert run_tasks(_attempt, ["ok"], client=client, name="t-ok", shared=(str(log),)) == ["ok"]


def test_output_cut_short_by_its_reader_is_quiet(tmp_path):
    """`shardkit ... | head`: the pipe closes before the output ends; no error line, the shell's status for it."""
    from factory import make_dataset

    root, _ = make_dataset(tmp_path / "d", 4, shards=1, fields=("txt",))
    p = subprocess.Popen([sys.executable, "-m", "shardkit.cli", "show", str(root), "#0", "--full"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before anything was written
    assert p.wait(timeout=120) == 141
    assert p.stderr.read() == b""


def test_debug_lines_reach_the_stderr_of_each_command_in_one_process(monkeypatch, tmp_path):
    """--debug logs to sys.stderr as it is when a line is written: each command in one process (another
    CliRunner here) gets its own lines, not the first one's closed stream; and --debug is the command's
    alone: the next command without it shows none (no handler left behind)."""
    import logging

    from click.testing import CliRunner

    from shardkit.demo.datagen import raw_folder

    logger = logging.getLogger("shardkit")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logger.level)
    raw_folder(str(tmp_path / "raw"), images_per_class=1, documents=1, bad=False)
    for i, debug in enumerate((True, True, False)):
        run = CliRunner().invoke(main, ["--debug"] * debug + ["build", str(tmp_path / "raw"), str(tmp_path / f"o{i}"),
                                                              "--workers", "0", "--no-progress"])
        assert run.exit_code == 0, run.output
        assert ("shardkit.build: " in run.stderr) == debug, run.stderr
        assert logger.handlers == []


@pytest.mark.parametrize("command", ["build", "dedup"])
def test_more_workers_than_the_machine_can_hold_is_one_line(raw_folder, tmp_path, monkeypatch, command):
    """1,000 embedded workers on 2 cores never started and printed tens of thousands of Dask lines."""
    import shardkit.identity as identity

    monkeypatch.setattr(identity, "usable_cores", lambda: 1)
    result = run(command, raw_folder, tmp_path / "out", "--workers", "5", "--no-progress")
    assert result.exit_code == 1
    err = one_line(result)
    assert "workers=5: more than 4 per core of this machine's 1 (at most 4)" in err and "--workers 1" in err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_worker_bound_holds_for_every_embedded_cluster_and_not_for_a_scheduler(tmp_path):
    from shardkit import build_map
    from shardkit.config import BuildConfig, DedupConfig
    from shardkit.errors import ConfigError
    from shardkit.identity import usable_cores

    too_many = 4 * usable_cores() + 1
    with pytest.raises(ConfigError, match=rf"workers={too_many}: more than 4 per core"):
        BuildConfig("raw", "out", workers=too_many)
    with pytest.raises(ConfigError, match=rf"workers={too_many}: more than 4 per core"):
        DedupConfig("raw", "out", workers=too_many)
    with pytest.raises(ConfigError, match=r"use workers= \d+ or leave it out"):
        build_map(str, range(3), str(tmp_path / "out"), workers=too_many)
    assert BuildConfig("raw", "out", workers=4 * usable_cores()).workers == 4 * usable_cores()
    assert BuildConfig("raw", "out", workers=too_many, scheduler="tcp://host:8786").workers == too_many
