"""WebDataset tar shards as a source: a set written by webdataset's ShardWriter builds into the same
samples; damage inside a tar rejects only the samples it touches; reruns, workers, dedup."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from PIL import Image

from shardkit.config import BuildConfig
from shardkit.errors import ConfigError
from shardkit.demo.datagen import _jpeg, photo_like
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest
from shardkit.reader.shards import read_shard_samples
from shardkit.sources.index import keys_table

from conftest import tree_bytes


def _samples(n: int, seed: int = 0, classes: int = 3) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"__key__": f"{i:09d}", "jpg": _jpeg(photo_like(rng, 40 + i % 7, 30)), "txt": f"a photo, number {i}",
             "json": {"i": i, "url": f"http://example.com/{i}.jpg"}, "cls": i % classes} for i in range(n)]


def _write_set(folder, samples: list[dict], per_tar: int) -> list[str]:
    """The samples as webdataset's own ShardWriter writes them; the tar paths."""
    os.makedirs(folder, exist_ok=True)
    with wds.ShardWriter(os.path.join(str(folder), "shard-%06d.tar"), maxcount=per_tar, verbose=0) as sink:
        for s in samples:
            sink.write(dict(s))
    return sorted(os.path.join(str(folder), n) for n in os.listdir(folder) if n.endswith(".tar"))


def _build(src, out, **kw):
    kw.setdefault("workers", 0)
    kw.setdefault("progress", False)
    return build(BuildConfig(src=str(src), out=str(out), **kw))


def _built(out) -> dict:
    m = load_manifest(str(out))
    return {s.key: s for shard in m.shards_of("tar") for s in read_shard_samples(str(out), m, shard)}


def _errors(out) -> list[dict]:
    with open(os.path.join(out, "errors.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _members(path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tf:
        return {m.name: m for m in tf.getmembers()}


def _plain_tar(path, members, *extra: tarfile.TarInfo) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for info in extra:
            tf.addfile(info)


def _tarfile_reads(path) -> int:
    try:
        with tarfile.open(path) as tf:
            return len(tf.getmembers())
    except tarfile.ReadError:
        return 0


def test_a_shardwriter_set_builds_into_the_same_samples_and_keeps_image_bytes(tmp_path):
    samples = _samples(20)
    tars = _write_set(tmp_path / "src", samples, per_tar=7)
    result = _build(tmp_path / "src", tmp_path / "out", encode="keep", max_samples_per_shard=6)
    assert (result.samples, result.inputs, result.rejections) == (20, 20, [])
    m = load_manifest(str(tmp_path / "out"))
    assert m.fields == {"jpg": {"kind": "image", "encoding": "keep"}, "txt": {"kind": "text"},
                        "json": {"kind": "json"}, "cls": {"kind": "int", "dtype": "int64"}}
    assert m.classes == ["0", "1", "2"]
    # what webdataset itself reads from the source tars, sample for sample
    read = {f"{os.path.basename(s['__url__'])[:-4]}/{s['__key__']}": s
            for s in wds.WebDataset(tars, shardshuffle=False, empty_check=False)}
    built = _built(tmp_path / "out")
    assert sorted(built) == sorted(read) and len(built) == 20
    for key, s in built.items():
        assert s.fields["jpg"] == read[key]["jpg"]  # --encode keep: the original bytes
        assert s.fields["txt"] == read[key]["txt"].decode()
        assert s.fields["json"] == json.loads(read[key]["json"])
        assert s.fields["cls"] == int(read[key]["cls"])
    assert list(built) == sorted(built)  # written in key order
    m = load_manifest(str(tmp_path / "out"))  # where each sample came from: its tar and position in it
    sources = pq.read_table(tmp_path / "out" / m.shards[1].index["path"]).to_pydict()
    assert sources["__key__"][2:4] == ["shard-000001/000000008", "shard-000001/000000009"]
    assert sources["__source__"][2:4] == ["shard-000001.tar"] * 2 and sources["__source_row__"][2:4] == [1, 2]


def test_a_tar_builds_the_bytes_of_the_folder_it_extracts_to(tmp_path):
    """A tar is read as the folder `tar xf` makes of it, named by its stem: the same shards, byte for byte
    (without labels: a folder's would come from its folder names)."""
    samples = [{k: v for k, v in s.items() if k != "cls"} for s in _samples(12)]
    tars = _write_set(tmp_path / "src", samples, per_tar=5)
    folder = tmp_path / "folder"
    for tar in tars:
        with tarfile.open(tar) as tf:
            tf.extractall(folder / os.path.basename(tar)[:-4], filter="data")
    opts = dict(image_size=24, resize_mode="center-crop", encode="jpeg", max_samples_per_shard=5, labels=False)
    _build(tmp_path / "src", tmp_path / "a", **opts)
    _build(folder, tmp_path / "b", **opts)
    a, b = (load_manifest(str(tmp_path / x)) for x in "ab")
    assert [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards] and a.samples == 12


def test_corrupt_members_are_rejected_alone_with_their_reason(tmp_path):
    samples = _samples(12)
    samples[3]["jpg"] = b"\xff\xd8\xff not a jpeg"
    samples[7]["json"] = b"{not json"
    samples[9]["cls"] = b"cat"
    _write_set(tmp_path / "src", samples, per_tar=100)
    result = _build(tmp_path / "src", tmp_path / "out")
    errors = {e["path"]: e["reason"] for e in _errors(tmp_path / "out")}
    assert set(errors) == {"shard-000000.tar:000000003", "shard-000000.tar:000000007", "shard-000000.tar:000000009"}
    assert errors["shard-000000.tar:000000003"].startswith("undecodable image")
    assert errors["shard-000000.tar:000000007"].startswith("invalid JSON member '000000007.json'")
    assert errors["shard-000000.tar:000000009"].startswith("bad label: member '000000009.cls' holds 'cat'")
    assert result.samples == 9 and result.inputs == 12
    assert len(_built(tmp_path / "out")) == 9


def test_a_truncated_tar_keeps_every_sample_before_the_cut(tmp_path):
    (tar,) = _write_set(tmp_path / "src", _samples(10), per_tar=100)
    cut = _members(tar)["000000006.txt"].offset_data + 5  # inside sample 6's second member
    with open(tar, "r+b") as f:
        f.truncate(cut)
    result = _build(tmp_path / "src", tmp_path / "out")
    (error,) = _errors(tmp_path / "out")
    assert error["path"] == "shard-000000.tar:000000006"
    assert error["reason"] == f"truncated tar: the file ends at byte {cut:,}, inside member '000000006.txt'"
    assert sorted(_built(tmp_path / "out")) == [f"shard-000000/{i:09d}" for i in range(6)]
    assert result.samples == 6


def test_a_tar_cut_between_members_rejects_its_last_sample(tmp_path):
    """No end-of-archive blocks: the last sample may have lost members after the cut."""
    (tar,) = _write_set(tmp_path / "src", _samples(4), per_tar=100)
    m = _members(tar)["000000003.json"]  # sample 3's members: cls, jpg, json, txt
    with open(tar, "r+b") as f:
        f.truncate(m.offset_data + (m.size + 511) // 512 * 512)
    _build(tmp_path / "src", tmp_path / "out")
    (error,) = _errors(tmp_path / "out")
    assert error["path"] == "shard-000000.tar:000000003" and "without the end-of-archive blocks" in error["reason"]
    assert len(_built(tmp_path / "out")) == 3


def test_a_damaged_header_rejects_its_sample_and_the_rest_is_read(tmp_path):
    """tarfile stops at a bad header in mid-archive and drops every member after it, silently."""
    first, second = _write_set(tmp_path / "src", _samples(20), per_tar=10)
    # tar 0: sample 4's jpg header (its mode field: the checksum fails, the name still reads);
    # tar 1: the pax header before sample 14's jpg header, which names no member
    for tar, at in [(first, _members(first)["000000004.jpg"].offset_data - 512 + 100),
                    (second, _members(second)["000000014.jpg"].offset + 100)]:
        with open(tar, "r+b") as f:
            f.seek(at)
            f.write(b"9")
        assert _tarfile_reads(tar) < 40  # tarfile alone stops there (silently, or with an error)
    _build(tmp_path / "src", tmp_path / "out")
    errors = {e["path"]: e["reason"] for e in _errors(tmp_path / "out")}
    assert sorted(errors) == ["shard-000000.tar:000000004", "shard-000001.tar:000000014"]
    assert errors["shard-000000.tar:000000004"].startswith("damaged tar header: member '000000004.jpg' lost")
    assert errors["shard-000001.tar:000000014"].startswith("damaged tar header: bytes")
    assert sorted(_built(tmp_path / "out")) == [f"shard-{i // 10:06d}/{i:09d}" for i in range(20) if i not in (4, 14)]


def test_an_unreadable_header_rejects_both_neighbours(tmp_path):
    (tar,) = _write_set(tmp_path / "src", _samples(6), per_tar=100)
    at = _members(tar)["000000003.cls"].offset  # sample 3's first member: a garbled name
    with open(tar, "r+b") as f:
        f.seek(at)
        f.write(b"\xff\xfe" * 50)
    _build(tmp_path / "src", tmp_path / "out")
    paths = sorted(e["path"] for e in _errors(tmp_path / "out"))
    assert paths == ["shard-000000.tar:000000002", "shard-000000.tar:000000003", f"shard-000000.tar@{at}"]
    assert sorted(_built(tmp_path / "out")) == [f"shard-000000/{i:09d}" for i in (0, 1, 4, 5)]


def test_tars_beside_files_labels_and_what_is_passed_over(tmp_path):
    src = tmp_path / "src"
    _write_set(src / "laion", [{k: v for k, v in s.items() if k != "cls"} for s in _samples(4)], per_tar=100)
    (src / "photos").mkdir()
    (src / "photos" / "a.jpg").write_bytes(_samples(1)[0]["jpg"])
    (src / "packed.tar.gz").write_bytes(b"\x1f\x8b compressed")
    (src / "notatar.tar").write_bytes(b"\x1f\x8b" + bytes(2000))
    link = tarfile.TarInfo("k3.jpg")  # a member type and an extension shardkit does not read
    link.type, link.linkname = tarfile.SYMTYPE, "k1.jpg"
    _plain_tar(src / "odd.tar", [("k1.jpg", _samples(1)[0]["jpg"]), ("k1.seg.png", b"x"), ("k2.seg.png", b"x")], link)
    built = _build(src, tmp_path / "dataset")  # a shardkit dataset below SRC is never read
    shutil.copytree(tmp_path / "dataset", src / "old_build")
    result = _build(src, tmp_path / "out")
    keys = sorted(_built(tmp_path / "out"))
    assert keys == ["laion/shard-000000/" + f"{i:09d}" for i in range(4)] + ["odd/k1", "photos/a"]
    assert built.samples == result.samples == 6
    reasons = {e["path"]: e["reason"] for e in _errors(tmp_path / "out")}
    assert reasons["notatar.tar"].startswith("not a tar file")
    assert reasons["packed.tar.gz"].startswith("unsupported extension")
    assert reasons["old_build/"].startswith("a shardkit dataset")
    assert set(reasons) == {"notatar.tar", "packed.tar.gz", "old_build/", "odd.tar"}
    odd = [e["reason"] for e in _errors(tmp_path / "out") if e["path"] == "odd.tar"]
    assert sorted(odd) == ["not a regular file (a link or device), 1 member(s) not read (e.g. 'k3.jpg')",
                           "unsupported extension: '.seg.png', 2 member(s) not read (e.g. 'k1.seg.png')"]
    m = load_manifest(str(tmp_path / "out"))
    assert m.classes == ["laion", "photos"]  # folder labels, as for other files (odd.tar is in no class folder)
    built = _built(tmp_path / "out")
    assert built["photos/a"].fields["cls"] == 1 and "cls" not in built["odd/k1"].fields


def test_cls_members_and_folder_labels(tmp_path):
    src = tmp_path / "src"
    _write_set(src / "a", _samples(4), per_tar=100)
    _write_set(src / "b", _samples(3, seed=1), per_tar=100)
    result = _build(src, tmp_path / "cls")
    built = _built(tmp_path / "cls")
    assert load_manifest(str(tmp_path / "cls")).classes == ["0", "1", "2"]
    assert [built[k].fields["cls"] for k in sorted(built)] == [0, 1, 2, 0, 0, 1, 2]
    assert any("cls members" in n for n in result.notes)
    # --labels: the first-level folders, as for any file; the cls members are not read
    result = _build(src, tmp_path / "folders", labels=True)
    built = _built(tmp_path / "folders")
    assert load_manifest(str(tmp_path / "folders")).classes == ["a", "b"]
    assert [built[k].fields["cls"] for k in sorted(built)] == [0] * 4 + [1] * 3
    assert any("not used as labels (--labels)" in n for n in result.notes)
    _build(src, tmp_path / "none", labels=False)
    assert "cls" not in load_manifest(str(tmp_path / "none")).fields
    _write_set(src / "c", [dict(_samples(1)[0], cls=5_000_000)], per_tar=1)
    with pytest.raises(ConfigError, match="go up to 5,000,000: more than 1,000,000 classes.*--no-labels"):
        _build(src, tmp_path / "many")


def test_a_tar_among_files_of_its_own_name_is_read_in_key_order(tmp_path):
    """Keys of `a.tar` and of files in `a/` interleave, one collides: the tar's samples join the file
    samples one by one (as a .jsonl's rows do), the colliding keys both get a suffix."""
    from shardkit.sources import read_records, scan

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    _plain_tar(src / "a.tar", [("1.txt", b"one"), ("3.txt", b"three (tar)"), ("3.json", b'{"x": 3}')])
    (src / "a" / "2.txt").write_text("two")
    (src / "a" / "3.txt").write_text("three (file)")
    _build(src, tmp_path / "out", labels=False)
    built = _built(tmp_path / "out")
    assert list(built)[:2] == ["a/1", "a/2"] and len(built) == 4
    threes = sorted(s.fields["txt"] for k, s in built.items() if k.startswith("a/3_"))
    assert threes == ["three (file)", "three (tar)"]
    assert next(s for s in built.values() if s.fields["txt"] == "three (tar)").fields["json"] == {"x": 3}
    scanned = scan(BuildConfig(src=str(src), out=str(tmp_path / "o2"), labels=False))  # the per-sample view
    read = {rec.key: sample.fields for rec, sample in read_records(str(src), scanned.records)}
    assert read == {k: s.fields for k, s in built.items()}


def test_reruns_reuse_shards_and_a_changed_tar_rebuilds_only_its_shards(tmp_path):
    samples = _samples(21)
    tars = _write_set(tmp_path / "src", samples, per_tar=7)
    opts = dict(max_samples_per_shard=7, image_size=24, resize_mode="center-crop")
    first = _build(tmp_path / "src", tmp_path / "out", **opts)
    before = tree_bytes(tmp_path / "out")
    keys_table.cache_clear()  # as a new process would: the rerun reads the keys files the first build kept
    again = _build(tmp_path / "src", tmp_path / "out", **opts)
    assert (len(first.shards), again.reused_shards) == (3, 3) and tree_bytes(tmp_path / "out") == before
    samples[10]["txt"] = "a new caption"
    os.remove(tars[1])
    with wds.TarWriter(tars[1]) as sink:  # tar 1 written again, one caption changed
        for s in samples[7:14]:
            sink.write(dict(s))
    third = _build(tmp_path / "src", tmp_path / "out", **opts)
    assert third.reused_shards == 2
    after = tree_bytes(tmp_path / "out")
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert {k for k in changed if k.startswith("shards/")} == {"shards/data-00001.tar",
                                                               "shards/data-00001.tar.idx.parquet"}
    assert _built(tmp_path / "out")["shard-000001/000000010"].fields["txt"] == "a new caption"


def test_same_bytes_at_0_and_2_workers(tmp_path):
    samples = _samples(30)
    samples[4]["jpg"] = b"broken"
    _write_set(tmp_path / "src", samples, per_tar=8)
    opts = dict(image_size=24, resize_mode="center-crop", max_samples_per_shard=9, format="both")
    _build(tmp_path / "src", tmp_path / "w0", workers=0, **opts)
    _build(tmp_path / "src", tmp_path / "w2", workers=2, unit_samples=4, worker_pool="threads", **opts)
    _build(tmp_path / "src", tmp_path / "p2", workers=2, unit_samples=4, worker_pool="processes", **opts)
    assert tree_bytes(tmp_path / "w0") == tree_bytes(tmp_path / "w2") == tree_bytes(tmp_path / "p2")
    assert len(_errors(tmp_path / "w0")) == 1


def test_dedup_on_a_tar_source(tmp_path):
    from click.testing import CliRunner

    from shardkit.cli import main

    samples = _samples(12)
    samples[9]["jpg"] = samples[2]["jpg"]  # an exact copy in another tar
    _write_set(tmp_path / "src", samples, per_tar=5)
    run = CliRunner().invoke(main, ["dedup", str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "0",
                                    "--no-progress"])
    assert run.exit_code == 0, run.output
    built = _built(tmp_path / "out")
    assert len(built) == 11 and "shard-000001/000000009" not in built and "shard-000000/000000002" in built
    assert built["shard-000000/000000002"].fields["jpg"] == samples[2]["jpg"]  # dedup keeps the bytes
    summary = json.loads((tmp_path / "out" / "dedup" / "summary.json").read_text())
    assert summary["removed"] == 1 and summary["inputs"] == 12


def test_resize_dedup_and_reshard_in_one_command(tmp_path):
    from click.testing import CliRunner

    from shardkit.cli import main

    samples = _samples(10)
    samples[7]["jpg"] = samples[1]["jpg"]
    _write_set(tmp_path / "src", samples, per_tar=3)
    run = CliRunner().invoke(main, ["build", str(tmp_path / "src"), str(tmp_path / "out"), "--image-size", "16",
                                    "--dedup", "--max-samples-per-shard", "4", "--workers", "0", "--no-progress"])
    assert run.exit_code == 0, run.output
    m = load_manifest(str(tmp_path / "out"))
    assert m.samples == 9 and [s.samples for s in m.shards] == [4, 4, 1]
    assert all(min(Image.open(io.BytesIO(s.fields["jpg"])).size) == 16 for s in _built(tmp_path / "out").values())


def test_the_worker_pool_probe_measures_images_inside_tars(tmp_path, monkeypatch):
    from shardkit.jobs.build import probe as B
    from shardkit.sources.walk import walk

    samples = _samples(12)
    _write_set(tmp_path / "src", samples, per_tar=5)
    probed = []
    monkeypatch.setattr(B, "gil_share_median", lambda work: probed.append(work()) or (0.01, 0.001))
    cfg = BuildConfig(src=str(tmp_path / "src"), out=str(tmp_path / "out"), encode="keep")
    assert B.probe(cfg, walk(cfg.src)) == (0.01, 0.001)
    assert probed == [samples[0]["jpg"]]  # the first image of the first tar, through the build's own work
    assert B.first_images(cfg.src, ["shard-000001.tar", "shard-000002.tar"], 8) == [s["jpg"] for s in samples[5:12]][:8]


def test_dedup_estimates_a_tar_of_images_as_images(tmp_path):
    from shardkit.jobs.dedup_tasks import IMAGE_BYTES_PER_SECOND, estimate_inventory_seconds
    from shardkit.sources.inventory import make_inventory, scan_options
    from shardkit.sources.rows import count_rows
    from shardkit.sources.walk import walk

    _write_set(tmp_path / "src", _samples(10), per_tar=100)
    cfg = BuildConfig(src=str(tmp_path / "src"), out=str(tmp_path / "out"))
    opts, listing = scan_options(cfg), walk(cfg.src)
    inv = make_inventory(listing, {rf.id: count_rows(rf, opts) for rf in listing.row_files}, cfg, opts)
    size = os.path.getsize(tmp_path / "src" / "shard-000000.tar")
    assert 0.5 < estimate_inventory_seconds(inv) * IMAGE_BYTES_PER_SECOND["keep"] / size < 1.0
