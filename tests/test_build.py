"""`shardkit build` end to end: nothing lost, determinism, interop, reruns, verify, path safety."""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image

from shardkit.cli import main
from shardkit.config import BuildConfig
from shardkit.errors import ManifestError
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest

from conftest import tree_bytes


def _build(raw, out, **kw):
    kw.setdefault("workers", 0)
    kw.setdefault("progress", False)
    return build(BuildConfig(src=str(raw), out=str(out), **kw))


def _errors(out):
    with open(os.path.join(out, "errors.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_nothing_lost_every_input_written_or_rejected(raw_folder, tmp_path):
    out = tmp_path / "out"
    result = _build(raw_folder, out, image_size=64, resize_mode="center-crop", format="both",
                    max_samples_per_shard=7)
    errors = _errors(out)
    assert result.samples + len(errors) == result.inputs
    assert all(set(e) == {"path", "stage", "reason"} and e["reason"] for e in errors)
    rejected = {e["path"]: e["reason"] for e in errors}
    for path, kind in [("cat/truncated.jpg", "truncated image"), ("cat/empty.jpg", "empty file"),
                       ("dog/not_an_image.jpg", "undecodable image"), ("notes.xyz", "unsupported extension"),
                       (".DS_Store", "hidden file"), ("corpus.jsonl:", "invalid JSON line")]:
        hits = [r for p, r in rejected.items() if p.startswith(path)]
        assert hits and hits[0].startswith(kind), (path, rejected)
    m = load_manifest(str(out))
    assert m.samples == result.samples == sum(s.samples for s in m.shards_of("tar"))
    assert m.errors["count"] == len(errors)
    keys = set()
    for shard in m.shards_of("parquet"):
        keys |= set(pq.read_table(out / shard.path, columns=["__key__"]).column(0).to_pylist())
    # the unusual-but-valid inputs were converted and kept
    for key in ["dog/cmyk", "bird/deep16", "bird/palette_alpha", "cat/rotated", "dog/nested/deep/puppy", "latin1"]:
        assert key in keys
    assert any(k.startswith("cat/caf") for k in keys)
    assert len(keys) == result.samples


def test_converted_images_are_rgb_of_the_requested_size(raw_folder, tmp_path):
    out = tmp_path / "out"
    _build(raw_folder, out, image_size=48, resize_mode="center-crop", encode="raw", format="parquet")
    m = load_manifest(str(out))
    assert m.fields["raw"] == {"kind": "image", "encoding": "raw", "dtype": "uint8", "shape": [48, 48, 3]}
    table = pq.read_table(out / m.shards_of("parquet")[0].path)
    row = table.to_pylist()
    by_key = {r["__key__"]: r for r in row}
    pal = np.frombuffer(by_key["bird/palette_alpha"]["raw"], np.uint8).reshape(48, 48, 3)
    assert pal.shape == (48, 48, 3)
    assert by_key["dog/cmyk"]["cls"] == m.classes.index("dog")


def test_on_error_fail_exits_non_zero(raw_folder, tmp_path):
    res = CliRunner().invoke(main, ["build", str(raw_folder), str(tmp_path / "out"), "--workers", "0",
                                    "--on-error", "fail", "--no-progress"])
    assert res.exit_code == 1
    assert "rejected" in res.output and "--on-error skip" in res.output
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_deterministic_bytes_whatever_the_worker_count(raw_folder, tmp_path):
    opts = dict(image_size=40, resize_mode="shorter", format="both", max_samples_per_shard=5)
    _build(raw_folder, tmp_path / "a", workers=0, **opts)
    _build(raw_folder, tmp_path / "b", workers=1, **opts)
    _build(raw_folder, tmp_path / "c", workers=2, **opts)
    a, b, c = (tree_bytes(tmp_path / x) for x in "abc")
    assert len(a) > 10
    assert a == b == c


def test_tar_shards_read_by_webdataset_match_the_manifest(raw_folder, tmp_path):
    import webdataset as wds

    out = tmp_path / "out"
    _build(raw_folder, out, image_size=32, resize_mode="pad", format="both", max_samples_per_shard=6)
    m = load_manifest(str(out))
    tars, parquets = m.shards_of("tar"), m.shards_of("parquet")
    assert [t.id for t in tars] == [p.id for p in parquets]
    total = 0
    for t, p in zip(tars, parquets):
        rows = pq.read_table(out / p.path).to_pylist()
        assert len(rows) == p.samples == t.samples
        samples = list(wds.WebDataset(str(out / t.path), shardshuffle=False, empty_check=False))
        assert [s["__key__"] for s in samples] == [r["__key__"] for r in rows]
        for s, r in zip(samples, rows):
            if r["jpg"] is not None:
                assert s["jpg"] == r["jpg"]
                assert Image.open(io.BytesIO(s["jpg"])).size == (32, 32)
            if r["cls"] is not None:
                assert int(s["cls"]) == r["cls"]
            if r["txt"] is not None:
                assert s["txt"].decode("utf-8") == r["txt"]
            if r["json"] is not None:
                assert json.loads(s["json"]) == json.loads(r["json"])
        total += len(samples)
    assert total == m.samples


def test_tar_index_offsets_slice_members(raw_folder, tmp_path):
    out = tmp_path / "out"
    _build(raw_folder, out, image_size=32, resize_mode="center-crop")
    shard = load_manifest(str(out)).shards_of("tar")[0]
    index = pq.read_table(out / shard.index["path"]).to_pylist()
    data = (out / shard.path).read_bytes()
    with tarfile.open(out / shard.path) as tf:
        members = {mi.name: tf.extractfile(mi).read() for mi in tf.getmembers()}
    for row in index:
        for field in ("jpg", "txt", "cls", "json"):
            off, size = row[f"{field}.offset"], row[f"{field}.size"]
            if off >= 0:
                assert data[off:off + size] == members[f"{row['__key__']}.{field}"]
            else:
                assert f"{row['__key__']}.{field}" not in members
    with tarfile.open(out / shard.path) as tf:
        assert all(mi.mtime == 0 and mi.uid == 0 and mi.gid == 0 and mi.mode == 0o644 for mi in tf.getmembers())


def test_rerun_skips_unchanged_shards_and_redoes_changed_ones(raw_folder, tmp_path):
    out = tmp_path / "out"
    opts = dict(image_size=32, resize_mode="center-crop", max_samples_per_shard=6)
    first = _build(raw_folder, out, **opts)
    before = tree_bytes(out)
    second = _build(raw_folder, out, **opts)
    n = len(first.shards)
    assert second.reused_shards == n and tree_bytes(out) == before
    # change one input: only its shard is rebuilt
    target = raw_folder / "cat" / "000001.txt"
    target.write_text("a new caption")
    third = _build(raw_folder, out, **opts)
    assert third.reused_shards == n - 1
    # change an option: everything is rebuilt
    fourth = _build(raw_folder, out, **{**opts, "quality": 70})
    assert fourth.reused_shards == 0


def test_rebuild_with_fewer_shards_removes_stale_files(raw_folder, tmp_path):
    out = tmp_path / "out"
    _build(raw_folder, out, max_samples_per_shard=4)
    _build(raw_folder, out, max_samples_per_shard=1000)
    m = load_manifest(str(out))
    named = {s.path for s in m.shards} | {s.index["path"] for s in m.shards if s.index}
    assert set(f"shards/{n}" for n in os.listdir(out / "shards")) == named
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0


def test_verify_names_corrupt_and_missing_shards(raw_folder, tmp_path):
    out = tmp_path / "out"
    _build(raw_folder, out, format="both", max_samples_per_shard=10)
    m = load_manifest(str(out))
    tars = m.shards_of("tar")
    path = out / tars[0].path
    data = bytearray(path.read_bytes())
    data[600] ^= 0xFF
    path.write_bytes(bytes(data))
    os.remove(out / m.shards_of("parquet")[1].path)
    res = CliRunner().invoke(main, ["verify", str(out)])
    assert res.exit_code == 1
    assert f"checksum  {tars[0].path}" in res.output
    assert f"missing   {m.shards_of('parquet')[1].path}" in res.output


@pytest.mark.parametrize("bad", ["../outside.tar", "/etc/passwd", "shards/../../x.tar", "C:/x.tar"])
def test_manifest_paths_must_stay_inside(raw_folder, tmp_path, bad):
    out = tmp_path / "out"
    _build(raw_folder, out)
    d = json.loads((out / "manifest.json").read_text())
    d["shards"][0]["path"] = bad
    (out / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError):
        load_manifest(str(out))
    res = CliRunner().invoke(main, ["verify", str(out)])
    assert res.exit_code == 1 and "manifest paths" in res.output


def test_summary_and_inspect(raw_folder, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["build", str(raw_folder), str(out), "--workers", "0", "--image-size", "32",
                                    "--no-progress"])
    assert res.exit_code == 0, res.output
    for word in ("inputs", "samples written", "rejected", "truncated image", "shards", "bytes", "time", "images/s"):
        assert word in res.output
    res = CliRunner().invoke(main, ["inspect", str(out), "--json"])
    info = json.loads(res.output)
    assert info["classes"] == ["bird", "cat", "dog"] and info["samples"] > 0
    assert set(info["fields"]) == {"jpg", "txt", "json", "cls"}


@pytest.mark.parametrize("args,message", [
    (["--encode", "raw"], "--encode raw"),
    (["--resize-mode", "pad"], "needs --image-size"),
    (["--shard-size", "12XB"], "cannot read size"),
    (["--quality", "0"], "quality"),
])
def test_bad_options_say_how_to_fix_them(raw_folder, tmp_path, args, message):
    res = CliRunner().invoke(main, ["build", str(raw_folder), str(tmp_path / "o"), "--workers", "0", *args])
    assert res.exit_code != 0
    assert message in res.output


def test_build_dedup_removes_planted_duplicates_and_accounts_for_them(tmp_path):
    import shutil

    from shardkit.demo.datagen import raw_folder, words

    raw = tmp_path / "raw"
    raw_folder(str(raw), images_per_class=4, documents=6, bad=False, seed=2)
    (raw / "cat" / "broken.jpg").write_bytes(b"")  # one rejection: not a source sample of the dedup
    rng = np.random.default_rng(5)
    text = words(rng, 200)
    (raw / "twin_a.txt").write_text(text)
    (raw / "twin_b.txt").write_text(text.replace("data", "DATA", 1) + " extra")  # near-identical
    shutil.copy(raw / "cat" / "000000.jpg", raw / "cat" / "copy_of_000000.jpg")  # exact image copy
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["build", str(raw), str(out), "--workers", "0", "--dedup", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "duplicates      2 removed" in res.output
    m = load_manifest(str(out))
    assert m.build["dedup"]["removed"] == 2 and m.build["dedup"]["source_samples"] == m.samples + 2
    assert m.errors["count"] == 1
    keys = {k for s in m.shards_of("tar") for k in pq.read_table(out / s.index["path"]).column("__key__").to_pylist()}
    assert "twin_a" in keys and "twin_b" not in keys
    assert "cat/000000" in keys and "cat/copy_of_000000" not in keys
    clusters = pq.read_table(out / "dedup" / "clusters.parquet").to_pylist()
    removed = {r["key"] for r in clusters if not r["kept"]}
    assert removed == {"twin_b", "cat/copy_of_000000"}
    assert m.samples == len(keys)
    inputs = int(next(line.split()[1] for line in res.output.splitlines() if line.strip().startswith("inputs")))
    assert inputs == m.samples + len(_errors(out)) + 2  # written + rejected + duplicates: nothing lost
    summary = json.loads((out / "dedup" / "summary.json").read_text())
    assert summary["inputs"] == m.samples + 2 + 1 and summary["rejected"] == 1  # the empty file counted there too
