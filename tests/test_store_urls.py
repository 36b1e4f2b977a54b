"""A location that is neither a local folder nor a URL shardkit can use is one line naming the fix, exit
status 2, and nothing written: never a local folder `./s3:` that the user takes for the bucket."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner
from moto_store import s3, tree  # noqa: F401 (the s3 fixture)

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
    from shardkit.demo.datagen import raw_folder

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
    import shardkit.store.remote as calls

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
    import shardkit.store.remote as calls

    monkeypatch.setitem(sys.modules, "aiohttp", None)
    calls.forget_filesystems()
    result = run("build", "http://127.0.0.1:9/raw", here / "out", "--workers", "0", "--no-progress")
    assert result.exit_code == 2 and "pip install 'shardkit[http]'" in one_line(result), result.output
    assert not (here / "out").exists()


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1/x", "FTP://127.0.0.1:1/x"])
def test_a_protocol_whose_backend_needs_more_than_the_url_is_a_bad_url(here, url):
    """fsspec's ftp backend takes its host as an argument of its own: made from the URL alone it was a
    TypeError (exit 70), after two tracebacks from its destructor. Now one line, exit 2, nothing written."""
    for args in (["build", here / "raw", url, "--workers", "0", "--no-progress"],
                 ["build", url, here / "out", "--workers", "0", "--no-progress"], ["inspect", url]):
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "ftp:// is not a store shardkit can use" in one_line(result), args
        assert "__del__" not in result.output + result.stderr
    assert not (here / "out").exists() and tree(here / "cwd") == []


def test_a_protocol_whose_backend_needs_more_in_a_real_process_prints_no_destructor_traceback(here):
    """The destructor's traceback goes to the real stderr (sys.unraisablehook), not the runner's."""
    import subprocess

    p = subprocess.run([sys.executable, "-m", "shardkit.cli", "build", str(here / "raw"), "ftp://127.0.0.1:1/x",
                        "--workers", "0", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr


BAD_BUCKETS = {
    "s3://Bad_Bucket!/x": "'Bad_Bucket!' is not a valid S3 bucket name (it holds '!B_'",
    "s3://ab/x": "it has 2 characters, S3 allows 3 to 63",
    f"s3://{'a' * 64}/x": "it has 64 characters",
    "s3://-bucket/x": "must start and end with a lowercase letter or a digit",
    "s3://my..bucket/x": "two dots",
    "s3://192.168.5.4/x": "written as an IP address",
    "s3a://xn--bucket/x": "reserves",
}


@pytest.mark.parametrize("url", sorted(BAD_BUCKETS))
def test_a_bucket_name_s3_would_refuse_is_refused_up_front(here, url):
    """botocore's own check comes after the retries, as a multi-line regex dump, exit 1."""
    for args in (["build", url, here / "out", "--workers", "0", "--no-progress"],
                 ["build", here / "raw", url, "--workers", "0", "--no-progress"], ["inspect", url]):
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert BAD_BUCKETS[url] in one_line(result), (args, result.stderr)
    assert not (here / "out").exists()


def test_a_valid_bucket_name_passes():
    from shardkit.store.urls import check_location

    for url in ("s3://shardkit-test/x", "s3://a.b-c.123/x", "s3://abc"):
        assert check_location(url, "SRC") == url


def test_a_src_in_a_bucket_that_does_not_exist_leaves_nothing_in_out(here, s3):
    """SRC is reached before OUT's lock is taken: OUT, which did not exist, still does not."""
    for out in (here / "out", "s3://shardkit-test/out"):
        result = run("build", "s3://no-such-bucket-here/raw", out, "--workers", "0", "--no-progress")
        assert result.exit_code == 1 and "s3://no-such-bucket-here/raw" in one_line(result), result.stderr
    assert not (here / "out").exists() and s3.keys("out") == []
    result = run("dedup", "s3://no-such-bucket-here/raw", here / "out", "--workers", "0", "--no-progress")
    assert result.exit_code == 1 and not (here / "out").exists()


def test_a_failed_start_into_a_new_local_out_removes_it_and_keeps_an_old_one(here, monkeypatch):
    import shardkit.jobs.build as executor

    monkeypatch.setattr(executor, "_build", lambda *args: (_ for _ in ()).throw(OSError(5, "I/O error")))
    result = run("build", here / "raw", here / "out", "--workers", "0", "--no-progress")
    assert result.exit_code == 4 and not (here / "out").exists()
    (here / "old").mkdir()
    run("build", here / "raw", here / "old", "--workers", "0", "--no-progress")
    assert (here / "old").is_dir()  # it was there before: kept (with its lock file)
