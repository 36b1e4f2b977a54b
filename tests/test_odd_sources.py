"""Entries of SRC that are not plain files with UTF-8 names never stop or hang a build: a FIFO, a
symlink to itself, a name with bytes that are not UTF-8 are each recorded in errors.jsonl with a
reason, and the build finishes with the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shardkit.demo import datagen


def _fifo(folder):
    os.mkfifo(folder / "pipe.jpg")  # a reader of it would block until a writer comes: never
    return "class_00/pipe.jpg", "not a regular file (a FIFO): not read"


def _self_link(folder):
    os.symlink("self", folder / "self")
    return "class_00/self", "unreadable: Too many levels of symbolic links"


def _latin1_name(folder):
    os.rename(os.fsencode(folder / "000000.jpg"), os.fsencode(folder) + b"/caf\xe9.jpg")
    return "class_00/caf\\xe9.jpg", "file name is not valid UTF-8: not read (rename it"


def _latin1_folder(folder):
    os.makedirs(os.fsencode(folder) + b"/\xffdir")
    os.rename(os.fsencode(folder / "000000.jpg"), os.fsencode(folder) + b"/\xffdir/000000.jpg")
    return "class_00/\\xffdir", "file name is not valid UTF-8: not read"


@pytest.mark.parametrize("make", [_fifo, _self_link, _latin1_name, _latin1_folder],
                         ids=["fifo", "self-link", "non-utf8-name", "non-utf8-folder"])
def test_an_odd_entry_is_recorded_and_the_build_finishes(tmp_path, make):
    src = tmp_path / "src"
    datagen.image_folder(str(src), n=12, classes=2, size=(16, 16), seed=1)
    path, reason = make(src / "class_00")
    run = subprocess.run([sys.executable, "-m", "shardkit.cli", "build", str(src), str(tmp_path / "out"),
                          "--workers", "0", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rejected = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [r["path"] for r in rejected] == [path]
    assert rejected[0]["reason"].startswith(reason) and rejected[0]["stage"] == "source"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["samples"] == (11 if make in (_latin1_name, _latin1_folder) else 12)
    assert manifest["errors"]["count"] == 1
