"""One writer per OUT (kill -9 leaves no stale lock), OUT inside SRC left out of the scan, empty inputs."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.config import BuildConfig
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest


def cli(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardkit.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def holder_pid(out) -> int | None:
    try:
        return json.loads((out / ".shardkit" / "lock").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def test_one_build_per_out_and_kill_9_leaves_no_stale_lock(raw_folder, tmp_path):
    out = tmp_path / "out"
    first = cli("build", str(raw_folder), str(out), "--workers", "0", "--no-progress")
    deadline = time.monotonic() + 60
    while holder_pid(out) != first.pid:  # it holds the lock: freeze it there, mid-build
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.005)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = cli("build", str(raw_folder), str(out), "--workers", "0", "--no-progress")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 3, err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert f"is being written by `shardkit build` (pid {first.pid} on host" in err
        assert not (out / "manifest.json").exists()
    finally:
        os.kill(first.pid, signal.SIGKILL)  # kill -9 while it holds the lock
        first.communicate()
    third = cli("build", str(raw_folder), str(out), "--workers", "0", "--no-progress")
    _, err = third.communicate(timeout=120)
    assert third.returncode == 0, err
    check = cli("verify", str(out))
    assert check.communicate(timeout=60) and check.returncode == 0


HOLD = """
import sys
from shardkit.store.locks import folder_lock
with folder_lock(sys.argv[1], "test holder"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_dedup_takes_the_lock_too(raw_folder, tmp_path):
    from shardkit.config import DedupConfig
    from shardkit.jobs.dedup import dedup
    from shardkit.errors import FolderLocked
    from shardkit.store.locks import folder_lock

    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(FolderLocked, match=rf"being written by `test holder` \(pid {holder.pid} on host"):
            dedup(DedupConfig(str(raw_folder), str(out), workers=0, progress=False))
    finally:
        holder.communicate("")
    # Released with its process; and joined in one only by the run it names: `dedup RAW OUT` runs a build
    # into the OUT it holds.
    with folder_lock(str(out), "shardkit dedup"), folder_lock(str(out), "shardkit build", within="shardkit dedup"):
        pass
    dedup(DedupConfig(str(raw_folder), str(out), workers=0, progress=False))


def keys_of(out) -> list[str]:
    from shardkit.reader.shards import read_shard_samples

    m = load_manifest(str(out))
    return sorted(s.key for shard in m.shards_of("tar") for s in read_shard_samples(str(out), m, shard))


def _summary(out):
    m = load_manifest(str(out))
    return m.samples, m.classes, sorted(m.fields), keys_of(out), (out / "errors.jsonl").read_text()


def test_out_inside_src_is_not_read_back(raw_folder):
    out = raw_folder / "out"
    cfg = BuildConfig(str(raw_folder), str(out), workers=0, progress=False, image_size=32)
    first = build(cfg)
    once = _summary(out)
    second = build(cfg)
    assert _summary(out) == once  # the same samples, classes, fields and rejections both times
    assert "out" not in load_manifest(str(out)).classes and second.samples == first.samples
    assert any(r.path == "out/" and "output folder (OUT)" in r.reason for r in second.rejections)


def test_other_datasets_inside_src_are_not_read(raw_folder, tmp_path):
    cfg = BuildConfig(str(raw_folder), str(tmp_path / "a"), workers=0, progress=False)
    alone = build(cfg).samples
    build(BuildConfig(str(raw_folder), str(raw_folder / "cat" / "old"), workers=0, progress=False))
    again = build(cfg)
    assert again.samples == alone
    assert any(r.path == "cat/old/" and "a shardkit dataset" in r.reason for r in again.rejections)


def test_a_folder_named_like_a_file_is_read_and_noted(raw_folder, tmp_path):
    (raw_folder / "cat" / "x.jpg").mkdir()
    os.rename(raw_folder / "cat" / "000001.jpg", raw_folder / "cat" / "x.jpg" / "inner.jpg")
    result = CliRunner().invoke(main, ["build", str(raw_folder), str(tmp_path / "out"), "--workers", "0",
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "note            folder 'cat/x.jpg/' is named like a file: read as a folder" in result.output
    assert any(k.startswith("cat/x_jpg/inner") for k in keys_of(tmp_path / "out"))


def test_empty_folder_is_an_error_unless_asked(tmp_path):
    from shardkit.errors import EmptyInput

    src = tmp_path / "empty"
    src.mkdir()
    (src / "notes.xyz").write_text("nothing shardkit reads")
    with pytest.raises(EmptyInput, match=r"holds no input shardkit can read \(1 files passed over: "
                                         r"\{'unsupported extension': 1\}\).*--allow-empty"):
        build(BuildConfig(str(src), str(tmp_path / "out"), workers=0, progress=False))
    assert not (tmp_path / "out" / "manifest.json").exists()
    result = build(BuildConfig(str(src), str(tmp_path / "out"), workers=0, progress=False, allow_empty=True))
    assert result.samples == 0 and load_manifest(str(tmp_path / "out")).samples == 0


def test_all_inputs_rejected_writes_no_manifest(tmp_path):
    from shardkit.errors import EmptyInput

    src = tmp_path / "bad"
    src.mkdir()
    (src / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(EmptyInput, match=r"no sample of .* passed the build: 1 inputs rejected"):
        build(BuildConfig(str(src), str(tmp_path / "out"), workers=0, progress=False))
    assert (tmp_path / "out" / "errors.jsonl").read_text().count("\n") == 1
    assert not (tmp_path / "out" / "manifest.json").exists()
