"""Resize and crop set apart ("shorter side 256, center crop 224") and the resampling filter: config,
CLI flags one-to-one, the stored pixels, and the manifest's record of both."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardkit.cli.build import build as build_command
from shardkit.cli import main
from shardkit.config import RESAMPLE_FILTERS, BuildConfig
from shardkit.errors import ConfigError
from shardkit.stages.image import process_image


def _cfg(**kw) -> BuildConfig:
    return BuildConfig(src="s", out="o", **kw)


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def _gradient(w: int, h: int) -> np.ndarray:
    x, y = np.meshgrid(np.arange(w), np.arange(h))
    return np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) % 256], -1).astype(np.uint8)


def test_shorter_256_then_center_crop_224_matches_pil_by_hand():
    src = _gradient(400, 300)
    got = process_image(_png(src), _cfg(image_size=256, crop_size=224, encode="raw", resample="bilinear"))
    im = Image.fromarray(src).resize((341, 256), Image.Resampling.BILINEAR, reducing_gap=3.0)
    left, top = (341 - 224) // 2, (256 - 224) // 2
    want = np.asarray(im.crop((left, top, left + 224, top + 224)))
    assert np.array_equal(np.frombuffer(got, np.uint8).reshape(224, 224, 3), want)


def test_crop_size_overrides_center_crop_and_shorter_keeps_shape():
    data = _png(_gradient(300, 200))
    a = process_image(data, _cfg(image_size=64, resize_mode="center-crop", crop_size=48, encode="raw"))
    b = process_image(data, _cfg(image_size=64, resize_mode="shorter", crop_size=48, encode="raw"))
    assert len(a) == len(b) == 48 * 48 * 3 and a == b
    png = process_image(data, _cfg(image_size=64, crop_size=48, encode="png"))
    assert Image.open(io.BytesIO(png)).size == (48, 48)


@pytest.mark.parametrize("name", RESAMPLE_FILTERS)
def test_each_filter_is_the_one_pil_applies(name):
    src = _gradient(97, 61)
    got = process_image(_png(src), _cfg(image_size=40, resize_mode="shorter", resample=name, encode="png"))
    w = round(97 * 40 / 61)
    want = Image.fromarray(src).resize((w, 40), getattr(Image.Resampling, name.upper()), reducing_gap=3.0)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(got))), np.asarray(want))


def test_filters_give_different_pixels():
    data = _png(_gradient(97, 61))
    outs = {process_image(data, _cfg(image_size=40, resample=f, encode="png")) for f in RESAMPLE_FILTERS}
    assert len(outs) >= 5  # nearest, box, bilinear, hamming, bicubic, lanczos: (nearly) all differ


@pytest.mark.parametrize("kw, message", [
    (dict(crop_size=224), "--crop-size 224 crops the centre of the resized image: give --image-size N"),
    (dict(image_size=64, resize_mode="pad", crop_size=32), "with --resize-mode shorter (or center-crop)"),
    (dict(image_size=200, crop_size=224), "--crop-size 224 is larger than --image-size 200"),
    (dict(image_size=200, crop_size=0), "crop_size=0: expected a positive integer (--crop-size)"),
    (dict(resample="cubic"), "resample='cubic' is not valid; choose one of nearest, box, bilinear"),
    (dict(image_size=64, encode="raw"), "--resize-mode center-crop or pad, or --crop-size C"),
])
def test_bad_values_say_how_to_fix(kw, message):
    with pytest.raises(ConfigError) as e:
        _cfg(**kw)
    assert message in str(e.value)


def test_every_build_flag_is_a_build_config_field():
    flags = {p.name for p in build_command.params if p.name not in ("src", "out")}
    fields = {f.name for f in dataclasses.fields(BuildConfig)} - {"src", "out"}
    assert flags == fields


def test_build_records_crop_and_filter_in_the_manifest(raw_folder, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["build", str(raw_folder), str(out), "--workers", "0", "--no-progress",
                                    "--image-size", "40", "--crop-size", "32", "--resample", "lanczos",
                                    "--encode", "raw"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    config = manifest["build"]["config"]
    assert (config["image_size"], config["crop_size"], config["resample"]) == (40, 32, "lanczos")
    assert manifest["fields"]["raw"]["shape"] == [32, 32, 3]
    again = CliRunner().invoke(main, ["build", str(raw_folder), str(tmp_path / "b"), "--workers", "0",
                                      "--no-progress", "--image-size", "40", "--crop-size", "32", "--encode", "raw"])
    assert again.exit_code == 0, again.output
    other = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert other["build"]["config"]["resample"] == "bicubic"
    assert other["build"]["hash"] != manifest["build"]["hash"]  # another filter: other bytes, another build
