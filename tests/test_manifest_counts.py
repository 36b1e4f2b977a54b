"""Sample counts in the manifest are checked on load, and `shardkit verify` checks them against the shards."""

import json
import os

import pytest
from click.testing import CliRunner
from factory import make_dataset

from shardkit.cli import main
from shardkit.errors import ManifestError
from shardkit.manifest import load_manifest
from shardkit.reader.dataset import StreamingDataset


def edit_manifest(root, change) -> None:
    path = os.path.join(root, "manifest.json")
    m = json.load(open(path))
    change(m)
    json.dump(m, open(path, "w"))


@pytest.mark.parametrize("bad", [-3, 2.5, "7", True, None])
def test_a_shard_count_that_is_not_a_count_is_refused(tmp_path, bad):
    root, _ = make_dataset(tmp_path, 40)
    edit_manifest(root, lambda m: m["shards"][1].update(samples=bad))
    with pytest.raises(ManifestError, match=rf"shard shards/data-00001.tar has samples={bad!r}; expected an integer"):
        StreamingDataset(root)


@pytest.mark.parametrize("field, change, says", [
    ("raw", {"kind": "imagF"}, "kind 'imagF'; expected one of image, "),  # a raw image read as plain bytes
    ("cls", {"kind": None}, "kind None"),
    ("raw", {"shape": [12, -16, 3]}, r"shape \[12, -16, 3\]; expected a list of positive integers"),
    ("raw", {"dtype": "uint9"}, "dtype 'uint9'; expected a numpy dtype name"),
])
def test_a_damaged_field_spec_is_refused(tmp_path, field, change, says):
    """manifest.json has no checksum: one flipped byte in a spec that still parses must not change how
    values decode, nor fail later with a KeyError."""
    root, _ = make_dataset(tmp_path, 8, shards=1, fields=("raw", "cls"))
    edit_manifest(root, lambda m: m["fields"][field].update(change))
    with pytest.raises(ManifestError, match=rf"field {field!r} has {says}.*the manifest is damaged"):
        StreamingDataset(root)


def test_counts_must_add_up_to_the_dataset(tmp_path):
    root, _ = make_dataset(tmp_path, 40, fmt="both")
    edit_manifest(root, lambda m: m.update(samples=41))
    with pytest.raises(ManifestError, match=r"its parquet shards hold 40 samples in all but it says samples=41"):
        load_manifest(root)
    edit_manifest(root, lambda m: m.update(samples=40) or m["shards"][0].update(samples=m["shards"][0]["samples"] + 1))
    with pytest.raises(ManifestError, match=r"its parquet shards hold 41 samples"):
        load_manifest(root)


def test_verify_counts_each_shard(tmp_path):
    root, _ = make_dataset(tmp_path, 40, fmt="both")
    runner = CliRunner()
    assert runner.invoke(main, ["verify", root]).exit_code == 0

    def shift(m):  # one sample moved between two shards' counts: the sum still matches
        tars = [s for s in m["shards"] if s["format"] == "tar"]
        tars[0]["samples"] -= 1
        tars[1]["samples"] += 1

    edit_manifest(root, shift)
    result = runner.invoke(main, ["verify", root])
    assert result.exit_code == 1
    assert "count     shards/data-00000.tar" in result.output and "count     shards/data-00001.tar" in result.output
    assert "indexes 9 samples, the manifest says 8" in result.output
    edit_manifest(root, lambda m: m.update(samples=39))
    result = runner.invoke(main, ["verify", root])
    assert result.exit_code == 1 and "hold 40 samples in all but it says samples=39" in result.output
