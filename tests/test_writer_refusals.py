"""Writers refuse rather than lose: a second writer on one folder (in this process too), a value that
cannot be stored (a BadSample at write, naming key and field, the dataset so far kept whole), a
writer closed with no sample, and build_map groups whose every input is skipped."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import map_fns
from shardkit import ShardWriter, StreamingDataset, build_map
from shardkit.errors import ConfigError, FolderLocked
from shardkit.store.locks import folder_lock
from shardkit.jobs.shard_writer import BadSample


def _keys(out, fmt=None) -> list[str]:
    return [s["__key__"] for s in StreamingDataset(str(out), shuffle=False, format=fmt)]


def test_a_second_shard_writer_on_one_folder_in_one_process_is_refused(tmp_path):
    out = tmp_path / "out"
    first = ShardWriter(str(out))
    first.write({"__key__": "a", "txt": "first writer"})
    with pytest.raises(FolderLocked, match=r"being written by `ShardWriter` in this process \(pid \d+"):
        ShardWriter(str(out))
    with pytest.raises(FolderLocked, match="in this process"):
        build_map(map_fns.other_make, range(3), str(out), workers=0, progress=False)
    first.write({"__key__": "b", "txt": "still the first writer"})
    first.close()
    assert _keys(out) == ["a", "b"]  # nothing of the first writer lost
    with ShardWriter(str(out)) as again:  # once closed, the folder is free
        again.write({"__key__": "c", "txt": "a new dataset"})
    assert _keys(out) == ["c"]


def test_only_the_named_holder_is_joined(tmp_path):
    """`dedup RAW OUT` runs its build inside the lock it holds; nothing else joins a held lock."""
    with folder_lock(str(tmp_path), "shardkit dedup"):
        with folder_lock(str(tmp_path), "shardkit build", within="shardkit dedup"):
            pass
        with pytest.raises(FolderLocked, match="`shardkit dedup` in this process"):
            with folder_lock(str(tmp_path), "shardkit build"):
                pass
        with pytest.raises(FolderLocked):
            with folder_lock(str(tmp_path), "shardkit build", within="build_map"):
                pass


FIRST = {"__key__": "k0", "txt": "plain", "json": {"a": "b"}, "arr": np.arange(3, dtype=np.float32)}


@pytest.mark.parametrize("field, value, words", [
    ("txt", "a\ud800b", ["lone surrogate", "'\\ud800' at character 1"]),
    ("txt", "bad name \udcff.jpg", ["lone surrogate", "errors='replace'"]),
    ("json", {"caption": "x\udc80"}, ["a str in the dict", "lone surrogate"]),
    ("arr", np.array([1, "two", None], dtype=object), ["dtype object cannot be stored"]),
    ("arr", np.array(["ab", "c", "d"]), ["dtype <U2 cannot be stored"]),
    ("arr", np.array(["2020-01-01"] * 3, "datetime64[D]"), ["datetime64[D] cannot be stored"]),
], ids=["surrogate", "surrogate-escape", "json-surrogate", "object-array", "str-array", "date-array"])
@pytest.mark.parametrize("fmt", ["tar", "parquet", "both"])
def test_a_value_that_cannot_be_stored_is_a_bad_sample_at_write(tmp_path, field, value, words, fmt):
    out = tmp_path / "out"
    with ShardWriter(str(out), format=fmt, max_samples_per_shard=2) as w:
        for i in range(3):
            w.write(dict(FIRST, __key__=f"k{i}"))
        with pytest.raises(BadSample) as refused:
            w.write(dict(FIRST, **{"__key__": "bad", field: value}))
        for word in ["'bad'", f"field {field!r}", *words]:
            assert word in str(refused.value)
        w.write(dict(FIRST, __key__="k3"))  # the writer goes on
    for f in (["tar", "parquet"] if fmt == "both" else [fmt]):
        ds = StreamingDataset(str(out), shuffle=False, format=f)
        assert [s["__key__"] for s in ds] == ["k0", "k1", "k2", "k3"]
        assert ds.get("k3")["txt"] == "plain" and ds.get("k1")["arr"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("value, words", [
    (np.array([1, None], dtype=object), ["'first'", "field 'arr'", "dtype object"]),
    (np.zeros((2, 0), np.float32), ["'first'", "field 'arr'", "shape [2, 0] has no values"]),
    ([1, 2], ["'first'", "field 'arr'", "holds a list"]),
])
def test_a_first_sample_that_cannot_be_stored_names_its_key_and_fixes_nothing(tmp_path, value, words):
    with ShardWriter(str(tmp_path / "out")) as w:
        with pytest.raises(BadSample) as refused:
            w.write({"__key__": "first", "arr": value})
        for word in words:
            assert word in str(refused.value)
        w.write({"__key__": "second", "arr": np.ones(2, np.int8)})
    assert StreamingDataset(str(tmp_path / "out"))[0]["arr"].tolist() == [1, 1]


def test_build_map_rejects_an_unstorable_value_as_that_input(tmp_path):
    r = build_map(map_fns.surrogate_at_4, range(8), str(tmp_path / "out"), workers=0, progress=False)
    assert r.samples == 7 and [x.path for x in r.rejections] == ["4"]
    assert "sample 'k004', field 'txt'" in r.rejections[0].reason and "lone surrogate" in r.rejections[0].reason


def test_a_writer_closed_with_no_sample_reads_as_empty_with_a_clear_message(tmp_path):
    from shardkit.cli import main

    out = tmp_path / "empty"
    ShardWriter(str(out)).close()
    with pytest.raises(ConfigError, match=r"holds no samples \(its manifest lists no shards\): write samples"):
        StreamingDataset(str(out))
    shown = subprocess.run([sys.executable, "-m", "shardkit.cli", "show", str(out), "#0"], capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 1, shown.stderr
    assert shown.stderr.count("\n") == 1 and "holds no samples" in shown.stderr
    for command in (["inspect", str(out)], ["verify", str(out)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize("run", [dict(workers=0), dict(workers=2, worker_pool="threads")], ids=["in-process", "threads"])
def test_build_map_whose_fn_skips_a_whole_group(tmp_path, run):
    """None skips the input: a group of inputs that all return None (a filter) writes no shard."""
    r = build_map(map_fns.skip_below_10, range(30), str(tmp_path / "out"), inputs_per_shard=10, progress=False,
                  **run)
    assert r.samples == 20 and not r.rejections
    assert _keys(tmp_path / "out") == [f"k{i:03d}" for i in range(10, 30)]
    r = build_map(map_fns.skip_below_10, range(30), str(tmp_path / "out"), inputs_per_shard=10, progress=False,
                  **run)
    assert r.samples == 20 and r.reused_shards == 2  # the rerun reuses every group, the empty one included
