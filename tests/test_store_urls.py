"""A location that is neither a local folder nor a URL shardkit can use is one line naming the fix, exit
status 2, and nothing written: never a local folder `./s3:` that the user takes for the bucket."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner
from moto_store import tree

from shardkit.cli import main
from shardkit.errors import BadURL

BAD = {
    "s3:/bucket/out": "did you mean 's3://bucket/out'?",
    "s3//bucket/out": "did you mean 's3://bucket/out'?",
    "s3:bucket/out": "did you mean 's3://bucket/out'?",
    "nosuchproto://bucket/out": "unknown protocol 'nosuchproto://'",
    "s3://": "names no bucket",
}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(result) -> str:
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A raw folder, the current folder set to an empty one (where a mistyped URL would become a folder)."""
    from shardkit.datagen import raw_folder

    raw_folder(str(tmp_path / "raw"), images_per_class=2, documents=2, bad=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path


@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_out_url_is_one_line_exit_2_and_writes_nothing(here, bad):
    raw = here / "raw"
    for args in (["build", raw, bad], ["build", raw, bad, "--map", "x:y"], ["dedup", raw, bad],
                 ["build", bad, here / "out"], ["dedup", bad, here / "out2"]):
        result = run(*args, "--workers", "0", "--no-progress")
        assert result.exit_code == 2, (args, result.output)
        assert BAD[bad] in one_line(result), args
    for command in ("verify", "inspect"):
        result = run(command, bad)
        assert result.exit_code == 2 and BAD[bad] in one_line(result), command
    result = run("show", bad, "some/key")
    assert result.exit_code == 2 and BAD[bad] in one_line(result)
    assert tree(here / "cwd") == [] and not (here / "out").exists() and not (here / "out2").exists()


def test_a_missing_extra_names_the_pip_command(here, monkeypatch):
    import shardkit.store.calls as calls

    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if shardkit[s3] were not installed
    calls.forget_filesystems()
    for args in (["build", here / "raw", "s3://bucket/out"], ["build", "s3://bucket/raw", here / "out"],
                 ["dedup", here / "raw", "s3://bucket/out"], ["verify", "s3://bucket/ds"],
                 ["inspect", "s3://bucket/ds"]):
        result = run(*args, *(["--workers", "0", "--no-progress"] if args[0] in ("build", "dedup") else []))
        assert result.exit_code == 2, (args, result.output)
        assert "pip install 'shardkit[s3]'" in one_line(result), args
    assert tree(here / "cwd") == [] and not (here / "out").exists()


def test_http_is_read_only(here):
    result = run("build", here / "raw", "https://example.com/out", "--workers", "0", "--no-progress")
    assert result.exit_code == 2 and "read-only" in one_line(result)


@pytest.mark.parametrize("bad", ["s3:/bucket/out", "s3//bucket/out", "nosuchproto://bucket/out"])
def test_library_entry_points_refuse_before_writing(here, bad):
    from shardkit import ShardWriter, build_map

    with pytest.raises(BadURL, match="bucket"):
        ShardWriter(bad)
    with pytest.raises(BadURL, match="bucket"):
        build_map(lambda x: {"__key__": str(x), "txt": "a"}, [1, 2], bad, workers=0, progress=False)
    from shardkit import StreamingDataset

    with pytest.raises(BadURL, match="bucket"):
        StreamingDataset(bad)
    assert tree(here / "cwd") == []


def test_a_local_folder_with_a_colon_is_written_as_such(here):
    """The error says how to mean a local folder named like that: ./s3:/... works."""
    result = run("build", here / "raw", "./s3:/bucket/out", "--workers", "0", "--no-progress")
    assert result.exit_code == 0, result.output
    assert (here / "cwd" / "s3:" / "bucket" / "out" / "manifest.json").is_file()


def test_an_http_src_without_its_client_is_refused_before_out_is_made(here, monkeypatch):
    """A dataset over http(s) is read on shardkit's own connections; a raw SRC there is listed through
    fsspec's client (aiohttp): without it the build names the extra before it writes anything."""
    import shardkit.store.calls as calls

    monkeypatch.setitem(sys.modules, "aiohttp", None)
    calls.forget_filesystems()
    result = run("build", "http://127.0.0.1:9/raw", here / "out", "--workers", "0", "--no-progress")
    assert result.exit_code == 2 and "pip install 'shardkit[http]'" in one_line(result), result.output
    assert not (here / "out").exists()
