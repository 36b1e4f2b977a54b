"""Build writes baseline 4:2:0 JPEG (what GPUs' hardware decoders take); inspect says when a
dataset holds progressive JPEGs, and their share."""

from __future__ import annotations

import io
import json
import tarfile

from click.testing import CliRunner
from PIL import Image

from shardkit.cli import main
from shardkit.config import BuildConfig
from shardkit.jobs.build import build
from shardkit.manifest import load_manifest
from shardkit.manifest.jpeg_kinds import jpeg_kind


def _jpegs(out):
    m = load_manifest(str(out))
    found = []
    for shard in m.shards_of("tar"):
        with tarfile.open(out / shard.path) as tar:
            found += [tar.extractfile(x).read() for x in tar.getmembers() if x.name.endswith(".jpg")]
    return found


def test_build_writes_baseline_jpeg_with_420_chroma(raw_folder, tmp_path):
    out = tmp_path / "out"
    build(BuildConfig(src=str(raw_folder), out=str(out), workers=0, progress=False, image_size=48, format="tar"))
    found = _jpegs(out)
    assert found
    for data in found:
        im = Image.open(io.BytesIO(data))
        assert not im.info.get("progressive") and not im.info.get("progression")
        assert [(h, v) for _, h, v, _ in im.layer][0] == (2, 2)  # luma sampled 2x2: 4:2:0
        assert jpeg_kind(data) == "baseline"


def _folder(root, progressive: int, baseline: int):
    for i in range(progressive + baseline):
        cls = root / "a"
        cls.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (24, 16), (i * 9 % 255, 40, 90)).save(cls / f"{i:03d}.jpg", "JPEG", quality=90,
                                                              progressive=i < progressive)


def test_inspect_names_the_share_of_progressive_jpegs(tmp_path):
    _folder(tmp_path / "src", progressive=3, baseline=9)
    out = tmp_path / "out"
    build(BuildConfig(src=str(tmp_path / "src"), out=str(out), workers=0, progress=False, encode="keep",
                      format="tar"))
    res = CliRunner().invoke(main, ["inspect", str(out)])
    assert res.exit_code == 0, res.output
    assert "25% of 12 sampled jpg images are progressive JPEG" in res.output
    info = json.loads(CliRunner().invoke(main, ["inspect", str(out), "--json"]).output)
    assert info["jpeg"] == {"field": "jpg", "sampled": 12, "progressive": 3, "share": 0.25}


def test_inspect_is_quiet_about_baseline_jpegs(raw_folder, tmp_path):
    out = tmp_path / "out"
    build(BuildConfig(src=str(raw_folder), out=str(out), workers=0, progress=False, image_size=32, format="parquet"))
    res = CliRunner().invoke(main, ["inspect", str(out)])
    assert res.exit_code == 0 and "progressive" not in res.output
    info = json.loads(CliRunner().invoke(main, ["inspect", str(out), "--json"]).output)
    assert info["jpeg"]["progressive"] == 0 and info["jpeg"]["sampled"] > 0
