"""`shardkit show`: a sample by key or #index, its fields printed, its image written with --out."""

import numpy as np
import pytest
from click.testing import CliRunner
from factory import make_dataset
from PIL import Image

from shardkit.cli import main

FIELDS = ("jpg", "raw", "cls", "txt", "json")


def run(*args):
    return CliRunner().invoke(main, ["show", *map(str, args)])


@pytest.fixture
def dataset(tmp_path):
    return make_dataset(tmp_path / "d", 20, shards=3, fmt="both", fields=FIELDS)


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_show_by_key_and_by_index_print_every_field(dataset, fmt):
    root, samples = dataset
    by_key = run(root, "class1/s00004", "--format", fmt)
    assert by_key.exit_code == 0, by_key.output
    lines = by_key.output.splitlines()
    assert lines[0] == f"sample #8 of {root}"
    fields = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:]}
    assert fields["__key__"] == "class1/s00004" and fields["cls"] == "1"
    assert fields["txt"] == "sample 4 ünïcode" and fields["json"] == '{"i": 4, "tags": ["a", "1"]}'
    assert fields["raw"].startswith("array shape (3, 12, 16) uint8 min ")  # shape, dtype, then a preview
    assert fields["raw"].endswith(", …]") and fields["jpg"].startswith("array shape (3, 12, 16) uint8")
    assert run(root, "#8", "--format", fmt).output == by_key.output
    last = run(root, "#-1")
    assert last.exit_code == 0 and f"__key__    {sorted(samples)[-1]}" in last.output


def test_show_out_writes_the_stored_jpeg_and_a_png_of_the_raw_array(dataset, tmp_path):
    root, samples = dataset
    key = "class2/s00005"
    result = run(root, key, "--out", tmp_path / "a.jpg")
    assert result.exit_code == 0 and "as stored" in result.output
    assert (tmp_path / "a.jpg").read_bytes() == samples[key].fields["jpg"]  # the first image field: jpg
    result = run(root, key, "--out", tmp_path / "raw", "--field", "raw", "--format", "parquet")
    assert result.exit_code == 0, result.output
    with Image.open(tmp_path / "raw") as im:  # no extension: PNG
        assert im.format == "PNG"
        assert np.array_equal(np.asarray(im), np.frombuffer(samples[key].fields["raw"], np.uint8).reshape(12, 16, 3))


def test_show_long_text_is_cut_unless_full(tmp_path):
    from factory import write_dataset

    from shardkit.sample import Sample

    root = tmp_path / "t"
    write_dataset(root, [Sample("a", {"txt": "x" * 5000})], shards=1)
    assert "… (5000 characters; --full prints all)" in run(root, "a").output
    assert "x" * 5000 in run(root, "a", "--full").output


@pytest.mark.parametrize("args,status,message", [
    (["nope"], 1, "no sample has key 'nope' in dataset"),
    (["#20"], 1, r"index 20 is out of range .* valid indices are 0..19"),
    (["#0", "--out", "x.png", "--field", "txt"], 1, r"--field 'txt': not an image field .* \['jpg', 'raw'\]"),
    (["#0", "--format", "webp"], 2, "Invalid value for '--format'"),
])
def test_show_errors_are_one_line(dataset, args, status, message):
    import re

    result = run(dataset[0], *args)
    assert result.exit_code == status
    assert "Traceback" not in result.stderr and re.search(message, result.stderr), result.stderr
    if status == 1:
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_show_key_flag_takes_a_hash_key_literally(tmp_path):
    from factory import write_dataset

    from shardkit.sample import Sample

    root = tmp_path / "h"
    write_dataset(root, [Sample("#1", {"txt": "literal"}), Sample("b", {"txt": "second"})], shards=1)
    assert "second" in run(root, "#1").output  # index 1
    assert "literal" in run(root, "#1", "--key").output


def test_show_a_file_that_is_not_a_dataset_is_a_clear_error(dataset):
    root, _ = dataset
    manifest = f"{root}/manifest.json"
    result = run(manifest, "#0")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert f"no manifest at {manifest}/manifest.json: is {manifest!r} a dataset" in result.stderr, result.stderr


def test_show_out_into_a_missing_folder_creates_it(dataset, tmp_path):
    root, samples = dataset
    out = tmp_path / "new" / "deeper" / "a.jpg"
    result = run(root, "class2/s00005", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes() == samples["class2/s00005"].fields["jpg"]
