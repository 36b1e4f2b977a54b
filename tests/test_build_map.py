"""build_map: the same bytes for any workers and pool, errors recorded per input, a rerun after
kill -9 gives the same bytes and no manifest lies in between, unchanged groups are reused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

import map_fns
from conftest import tree_bytes
from shardkit import StreamingDataset, build_map
from shardkit.errors import ConfigError, FailFast
from shardkit.jobs.shard_writer import BadSample

HERE = os.path.dirname(os.path.abspath(__file__))


def _shards(out) -> dict:
    """Every file of the dataset (shards, sidecars, errors.jsonl, the manifest and its table)."""
    return tree_bytes(out)


def test_same_bytes_for_workers_0_and_2_threads_and_processes(tmp_path):
    runs = {"w0": dict(workers=0), "threads": dict(workers=2, worker_pool="threads"),
            "processes": dict(workers=2, worker_pool="processes")}
    for name, options in runs.items():
        result = build_map(map_fns.make, range(100), str(tmp_path / name), format="both", inputs_per_shard=30,
                           progress=False, **options)
        assert result.samples == 99  # 100 inputs, one skipped, one raising, one giving two samples
    first = _shards(tmp_path / "w0")
    assert sorted(k for k in first if k.startswith("shards/")) == [
        f"shards/data-{g:05d}-000.{ext}" for g in range(4) for ext in ("parquet", "tar", "tar.idx.parquet")]
    for name in ("threads", "processes"):
        assert _shards(tmp_path / name) == first, name


def test_one_raising_input_of_100_is_recorded_and_the_rest_written(tmp_path):
    result = build_map(map_fns.make, list(range(100)), str(tmp_path / "out"), workers=0, progress=False)
    assert result.manifest.errors == {"count": 1, "by_reason": {"ValueError": 1}}
    lines = (tmp_path / "out" / "errors.jsonl").read_text().splitlines()
    assert lines == ['{"path": "37", "reason": "ValueError: no such thing as input 37", "stage": "map"}']
    ds = StreamingDataset(str(tmp_path / "out"), shuffle=False)
    keys = [s["__key__"] for s in ds]
    assert len(keys) == 99 and "k00037" not in keys and "k00005" not in keys and "k00011x" in keys
    assert ds.get("k00042")["txt"] == "t42"


def test_exit_status_0_from_a_script(tmp_path):
    script = (f"from shardkit import build_map\nimport map_fns\n"
              f"r = build_map(map_fns.make, range(100), {str(tmp_path / 'out')!r}, workers=0, progress=False)\n"
              "print(r.samples, len(r.rejections))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env())
    assert r.returncode == 0 and r.stdout.split() == ["99", "1"], r.stderr


def _env(**more):
    return dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), HERE]), **more)


def test_kill_9_then_rerun_gives_identical_bytes(tmp_path):
    build_map(map_fns.make, range(100), str(tmp_path / "clean"), workers=0, inputs_per_shard=20, progress=False)
    script = (f"from shardkit import build_map\nimport map_fns\n"
              f"build_map(map_fns.make, range(100), {str(tmp_path / 'out')!r}, workers=0, inputs_per_shard=20, "
              "progress=False)\n")
    build_map(map_fns.other_make, range(10), str(tmp_path / "out"), workers=0, progress=False)  # an older dataset
    r = subprocess.run([sys.executable, "-c", script], env=_env(MAP_KILL_AT="70"))
    assert r.returncode == -9
    out = tmp_path / "out"
    assert not (out / "manifest.json").exists()  # the older manifest went first: nothing lies about the shards
    # groups 0..2 finished before input 70; a marker is written once its shard is fsynced, on a thread,
    # so up to 3 of them name this run's shards (the older dataset's group 0 marker may still be there)
    done = sum(json.loads(p.read_text())["fingerprint"] == json.loads(
        (tmp_path / "clean" / ".shardkit" / "map" / "done" / p.name).read_text())["fingerprint"]
        for p in (out / ".shardkit" / "map" / "done").glob("group-?????.json"))  # not a temp kill -9 left
    assert done <= 3
    result = build_map(map_fns.make, range(100), str(out), workers=0, inputs_per_shard=20, progress=False)
    assert result.reused_shards == done
    assert tree_bytes(out) == tree_bytes(tmp_path / "clean")


def test_rerun_reuses_unchanged_groups_only(tmp_path):
    out = str(tmp_path / "out")
    assert build_map(map_fns.make, range(60), out, workers=0, inputs_per_shard=20, progress=False).reused_shards == 0
    assert build_map(map_fns.make, range(60), out, workers=0, inputs_per_shard=20, progress=False).reused_shards == 3
    # one more input: only the last group changes
    assert build_map(map_fns.make, range(61), out, workers=0, inputs_per_shard=20, progress=False).reused_shards == 3
    # another function, or other options: nothing reused
    assert build_map(map_fns.other_make, range(61), out, workers=0, inputs_per_shard=20,
                     progress=False).reused_shards == 0
    result = build_map(map_fns.other_make, range(61), out, workers=0, inputs_per_shard=20, max_samples_per_shard=7,
                       progress=False)
    assert result.reused_shards == 0 and [s.samples for s in result.shards][:4] == [7, 7, 6, 7]
    assert StreamingDataset(out, shuffle=False).manifest.samples == 61


def test_file_inputs_changed_on_disk_are_rebuilt(tmp_path):
    files = []
    for i in range(4):
        (tmp_path / f"{i}.txt").write_text(f"text {i}")
        files.append(str(tmp_path / f"{i}.txt"))

    out = str(tmp_path / "out")
    build_map(map_fns.read_text, files, out, workers=0, inputs_per_shard=2, progress=False)
    os.utime(files[3], ns=(1, 1))
    result = build_map(map_fns.read_text, files, out, workers=0, inputs_per_shard=2, progress=False)
    assert result.reused_shards == 1


def test_an_unpicklable_function_is_a_clear_error(tmp_path):
    lock = threading.Lock()

    def fn(i):
        with lock:
            return {"__key__": f"k{i}", "cls": i}

    with pytest.raises(ConfigError, match=r"cannot be sent to worker processes .*worker_pool='threads'.*workers=0"):
        build_map(fn, range(10), str(tmp_path / "out"), workers=2, worker_pool="processes", progress=False)
    result = build_map(fn, range(10), str(tmp_path / "out"), workers=2, worker_pool="threads", progress=False)
    assert result.samples == 10


def test_bad_samples_are_recorded_rejections(tmp_path):
    r = build_map(map_fns.wrong_kind, range(6), str(tmp_path / "a"), workers=0, progress=False)
    assert r.samples == 5 and r.rejections[0].path == "3"
    assert "sample 'k003', field 'cls': expected an int, got a text" in r.rejections[0].reason
    r = build_map(map_fns.same_key_in_group, range(6), str(tmp_path / "b"), workers=0, progress=False)
    assert r.samples == 5 and r.rejections[0].reason.startswith("duplicate key: 'same'")
    assert StreamingDataset(str(tmp_path / "b"), shuffle=False).get("same")["cls"] == 2  # the first input's


def test_a_key_made_in_two_shards_is_an_error_and_no_manifest(tmp_path):
    with pytest.raises(BadSample, match="key 'same' is made by the inputs of two shards"):
        build_map(map_fns.same_key_across, range(10), str(tmp_path / "out"), workers=0, inputs_per_shard=5,
                  progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_on_error_fail_stops_at_the_first(tmp_path):
    with pytest.raises(FailFast, match="'37'"):
        build_map(map_fns.make, range(100), str(tmp_path / "out"), workers=0, on_error="fail", progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_cli_build_map_runs_after_the_built_in_stages(tmp_path, raw_folder):
    def build(name, *extra):
        return subprocess.run([sys.executable, "-m", "shardkit.cli", "build", str(raw_folder), str(tmp_path / name),
                               "--image-size", "32", "--map", "map_fns:caption_length", "--no-progress", *extra],
                              capture_output=True, text=True, env=_env())

    for name, workers in (("w0", "0"), ("w2", "2")):
        r = build(name, "--workers", workers)
        assert r.returncode == 0, r.stderr
    assert _shards(tmp_path / "w0") == _shards(tmp_path / "w2")
    errors = [json.loads(line) for line in (tmp_path / "w0" / "errors.jsonl").read_text().splitlines()]
    mapped = [e for e in errors if e["stage"] == "map"]
    assert mapped and all(e["path"].split(":")[0].endswith(("3.jpg", "3.txt", ".jsonl")) for e in mapped)
    assert all(e["reason"].startswith("RuntimeError: cannot caption") for e in mapped)
    assert any(e["stage"] == "image" for e in errors)  # the build's own rejections are there too
    ds = StreamingDataset(str(tmp_path / "w0"), shuffle=False)
    keys = [s["__key__"] for s in ds]
    assert keys and not any(k.endswith(("3", "4")) for k in keys)
    one = ds.get("cat/000001")
    assert one["n"] == len("cat/000001") and min(one["jpg"].shape[1:]) == 32 and "cls" in one
    r = build("w0", "--workers", "0")
    assert r.returncode == 0 and "unchanged, reused" in r.stdout
    for cmd in ("verify", "inspect"):  # a build_map dataset is a dataset like any other
        r = subprocess.run([sys.executable, "-m", "shardkit.cli", cmd, str(tmp_path / "w0")], capture_output=True,
                           text=True, env=_env())
        assert r.returncode == 0, r.stdout + r.stderr


def test_cli_map_bad_spec_is_a_clear_error(tmp_path, raw_folder):
    r = subprocess.run([sys.executable, "-m", "shardkit.cli", "build", str(raw_folder), str(tmp_path / "o"),
                        "--map", "no_such_module_x:f"], capture_output=True, text=True, env=_env())
    assert r.returncode == 1 and "cannot import 'no_such_module_x'" in r.stderr + r.stdout


def test_build_config_map_is_not_ignored_by_build(tmp_path, raw_folder):
    from shardkit.config import BuildConfig
    from shardkit.jobs.build import build

    with pytest.raises(ConfigError, match="build_with_map"):
        build(BuildConfig(src=str(raw_folder), out=str(tmp_path / "o"), map="map_fns:caption_length"))
