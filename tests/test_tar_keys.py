"""Keys stay unique where tars overlap other sources (tar vs tar, tar vs folder, a tar's own members),
by one rule whatever the listing order, each renamed or rejected sample in errors.jsonl; a member whose
name is not UTF-8 is recorded and skipped, as a file of such a name is."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.manifest import load_manifest
from shardkit.reader.shards import read_shard_samples


def _tar(path, members) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def _cli(*args) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result.output


def _build(src, out, *extra) -> dict:
    """`shardkit build` then `shardkit verify`; {key: text} of every built sample."""
    _cli("build", src, out, "--no-labels", "--no-progress", *(extra or ("--workers", "0")))
    assert "ok:" in _cli("verify", out)
    m = load_manifest(str(out))
    keys = [(s.key, s.fields["txt"]) for shard in m.shards_of("tar") for s in read_shard_samples(str(out), m, shard)]
    assert len({k for k, _ in keys}) == len(keys), f"duplicate keys: {sorted(k for k, _ in keys)}"
    return dict(keys)


def _errors(out) -> list[dict]:
    return [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("wide", ["outer", "inner"])
def test_two_tars_giving_one_key_are_both_kept_under_keys_of_their_own(tmp_path, wide):
    """`dupA.tar` (member `x/0002.txt`) and `dupA/x.tar` (member `0002.txt`) both give `dupA/x/0002`;
    either tar's key range may hold the other's (the inner one used to stay one block, unchecked)."""
    src = tmp_path / "src"
    outer = [("x/0002.txt", b"outer")] + ([("x/0001.txt", b"o1"), ("y/0003.txt", b"o3")] if wide == "outer" else [])
    inner = [("0002.txt", b"inner")] + ([("0001.txt", b"i1"), ("0009.txt", b"i9")] if wide == "inner" else [])
    _tar(src / "dupA.tar", outer)
    _tar(src / "dupA" / "x.tar", inner)
    built = _build(src, tmp_path / "out")
    assert len(built) == len(outer) + len(inner)
    twos = {k: v for k, v in built.items() if k.startswith("dupA/x/0002")}
    assert sorted(twos.values()) == ["inner", "outer"] and "dupA/x/0002" not in twos
    renamed = {(e["path"], e["reason"].split(":")[0]) for e in _errors(tmp_path / "out")}
    assert renamed == {("dupA.tar:x/0002", "key collision"), ("dupA/x.tar:0002", "key collision")}
    by_path = {e["path"]: e["reason"] for e in _errors(tmp_path / "out")}
    for key, text in twos.items():
        assert f"written as {key!r}" in by_path["dupA.tar:x/0002" if text == "outer" else "dupA/x.tar:0002"]
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["errors"]["count"] == 0 and m["errors"]["renamed"] == 2


def test_the_new_keys_do_not_depend_on_the_listing_or_the_workers(tmp_path):
    """The new key is the old one plus a digest of the sample's own source: the same keys and bytes
    when the tars are listed in the other order (their names swap places) and at 2 workers."""
    a, b = tmp_path / "a", tmp_path / "b"
    _tar(a / "dupA.tar", [("x/0002.txt", b"outer")])
    _tar(a / "dupA" / "x.tar", [("0002.txt", b"inner")])
    _tar(a / "dupA" / "x" / "0002.tar", [("z.txt", b"deeper")])  # a third overlap, a folder deeper
    built = _build(a, tmp_path / "out-a")
    _tar(b / "dupA" / "x" / "0002.tar", [("z.txt", b"deeper")])  # created first, listed last
    _tar(b / "dupA" / "x.tar", [("0002.txt", b"inner")])
    _tar(b / "dupA.tar", [("x/0002.txt", b"outer")])
    assert _build(b, tmp_path / "out-b") == built
    assert _build(b, tmp_path / "out-w2", "--workers", "2", "--worker-pool", "threads") == built
    for name in ("shards/data-00000.tar", "errors.jsonl"):
        assert (tmp_path / "out-a" / name).read_bytes() == (tmp_path / "out-w2" / name).read_bytes()


def test_a_tar_and_a_folder_of_its_name_share_a_key(tmp_path):
    src = tmp_path / "src"
    _tar(src / "docs.tar", [("a.txt", b"tar a"), ("b.txt", b"tar b")])
    (src / "docs").mkdir()
    (src / "docs" / "b.txt").write_text("file b")
    built = _build(src, tmp_path / "out")
    assert built["docs/a"] == "tar a" and sorted(v for k, v in built.items() if k.startswith("docs/b_")) == \
        ["file b", "tar b"]
    assert sorted(e["path"] for e in _errors(tmp_path / "out")) == ["docs.tar:b", "docs/b.txt"]


def test_members_of_one_tar_whose_keys_meet_are_rejected_together(tmp_path, monkeypatch):
    """Names that differ only in what key sanitising drops give one key twice inside one tar: both
    samples are rejected (as non-consecutive members of one key are), whatever their order."""
    import shardkit.sources.tars as tars

    monkeypatch.setattr(tars, "make_key", str.lower)  # stands in for a sanitising clash (A vs a)
    src = tmp_path / "src"
    _tar(src / "t.tar", [("a.txt", b"lower"), ("b.txt", b"other"), ("A.txt", b"upper")])
    built = _build(src, tmp_path / "out")
    assert built == {"t/b": "other"}
    errors = _errors(tmp_path / "out")
    assert [e["path"] for e in errors] == ["t.tar:A", "t.tar:a"]
    assert all("ambiguous sample" in e["reason"] and "'t/a'" in e["reason"] for e in errors)


def test_a_member_name_that_is_not_utf8_is_recorded_and_skipped(tmp_path):
    src = tmp_path / "src"
    _tar(src / "a.tar", [("ok.txt", b"fine"), ("caf\udce9.txt", b"latin-1 name"), ("z.txt", b"last")])
    built = _build(src, tmp_path / "out")
    assert built == {"a/ok": "fine", "a/z": "last"}
    [error] = _errors(tmp_path / "out")
    assert error["path"] == "a.tar" and error["reason"].startswith("member name is not valid UTF-8:")
    assert "caf\\\\xe9.txt" in error["reason"]  # the bytes shown as \xNN (repr doubles the backslash)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["errors"]["count"] == 1
