"""The bring-your-own-samples recipes (pipelines/byo_*.py), each on data made here: image + caption
pairs from a CSV, detection boxes scaled with their image, wav files turned into log-mel arrays."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from shardkit import StreamingDataset

ROOT = Path(__file__).resolve().parents[1] / "pipelines"
RECIPES = ["byo_caption_csv", "byo_detection", "byo_logmel"]


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pairs(tmp_path) -> Path:
    (tmp_path / "img").mkdir()
    rows = ["image,caption"]
    for i in range(6):
        Image.new("RGB", (80 + 10 * i, 60), (40 * i, 100, 200)).save(tmp_path / "img" / f"{i}.jpg")
        rows.append(f'img/{i}.jpg,"a photo, number {i}"')
    rows.append("img/missing.jpg,gone")
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    return tmp_path / "pairs.csv"


def test_caption_csv(tmp_path):
    result = _recipe("byo_caption_csv").build(str(_pairs(tmp_path)), str(tmp_path / "out"), size=32, workers=0,
                                              progress=False)
    assert result.samples == 6 and len(result.rejections) == 1
    assert result.rejections[0].path == "(8, 'img/missing.jpg', 'gone')"
    assert result.rejections[0].reason.startswith("FileNotFoundError")
    ds = StreamingDataset(str(tmp_path / "out"), shuffle=False)
    s = ds.get("img/3")
    assert s["txt"] == "a photo, number 3" and s["jpg"].shape == (3, 32, math.floor(110 * 32 / 60 + 0.5))
    assert abs(int(s["jpg"][0].float().mean()) - 120) <= 3  # the image's own colour, through JPEG


def test_caption_csv_script_on_worker_processes(tmp_path):
    """Run as a script, its function lives in __main__ and goes to worker processes by value."""
    csv_path = _pairs(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    r = subprocess.run([sys.executable, str(ROOT / "byo_caption_csv.py"), str(csv_path), str(tmp_path / "p"),
                        "--size", "32", "--workers", "2", "--worker-pool", "processes"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "6 pairs written" in r.stdout, r.stderr
    _recipe("byo_caption_csv").build(str(csv_path), str(tmp_path / "w0"), size=32, workers=0, progress=False)
    for name in sorted(os.listdir(tmp_path / "w0" / "shards")):
        assert (tmp_path / "p" / "shards" / name).read_bytes() == (tmp_path / "w0" / "shards" / name).read_bytes()


def test_detection_boxes_follow_the_resize(tmp_path):
    im = Image.new("RGB", (200, 100), (0, 0, 0))
    ImageDraw.Draw(im).rectangle([40, 20, 79, 59], fill=(255, 0, 0))  # the box [40, 20, 80, 60], in pixels
    im.save(tmp_path / "a.png")
    anns = [{"image": "a.png", "boxes": [[40, 20, 80, 60]], "labels": [7]},
            {"image": "a.png", "boxes": [[5, 5, 1, 1]], "labels": [1]}]  # an inverted box: recorded
    (tmp_path / "ann.json").write_text(json.dumps(anns))
    result = _recipe("byo_detection").build(str(tmp_path / "ann.json"), str(tmp_path / "out"), size=50,
                                            workers=0, progress=False)
    assert result.samples == 1 and "inverted" in result.rejections[0].reason
    s = StreamingDataset(str(tmp_path / "out"), shuffle=False).get("a")
    assert s["json"] == {"boxes": [[20.0, 10.0, 40.0, 30.0]], "labels": [7], "size": [100, 50]}
    x0, y0, x1, y1 = (int(v) for v in s["json"]["boxes"][0])
    pixels = s["jpg"].permute(1, 2, 0).numpy().astype(int)
    inside = pixels[y0 + 2:y1 - 2, x0 + 2:x1 - 2]
    assert inside[..., 0].min() > 200 and inside[..., 1].max() < 60  # the scaled box frames the red square
    assert pixels[y1 + 3:, :, 0].max() < 60 and pixels[:, x1 + 3:, 0].max() < 60  # nothing red outside it


def _wav(path: Path, freq: float, seconds: float, rate=16000, channels=1, width=2):
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.5 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(np.repeat(pcm[:, None], channels, axis=1).tobytes() if width == 2 else bytes(len(t) * channels))


def test_wav_to_log_mel(tmp_path):
    recipe = _recipe("byo_logmel")
    wavs = tmp_path / "wavs"
    wavs.mkdir()
    _wav(wavs / "low.wav", 440, 1.3)
    _wav(wavs / "high.wav", 3000, 2.5, channels=2)
    _wav(wavs / "rate.wav", 440, 1.0, rate=8000)
    _wav(wavs / "bits.wav", 440, 1.0, width=1)
    result = recipe.build(str(wavs), str(tmp_path / "out"), seconds=2.0, n_mels=40, workers=0, progress=False)
    assert result.samples == 2
    reasons = sorted(r.reason for r in result.rejections)
    assert reasons[0].startswith("ValueError: 8-bit samples") and "expected 16000" in reasons[1]
    ds = StreamingDataset(str(tmp_path / "out"), shuffle=False)
    frames = 1 + (32000 - 400) // 160
    edges = recipe.mel_filters(16000, 400, 40) @ np.linspace(0, 8000, 201)  # filter-weighted centres (x sum)
    centres = edges / recipe.mel_filters(16000, 400, 40).sum(axis=1)
    for key, freq, seconds in (("low", 440, 1.3), ("high", 3000, 2.5)):
        s = ds.get(key)
        assert s["mel"].shape == (40, frames) and s["json"] == {"rate": 16000, "seconds": seconds}
        peak = int(s["mel"][:, :50].mean(axis=1).argmax())
        assert abs(centres[peak] - freq) < 0.15 * freq, (key, centres[peak])
    # the clip shorter than 2 s is padded with silence: its last frames are at the floor
    assert float(ds.get("low")["mel"][:, -10:].max()) < math.log(1e-5)
    signal, _ = recipe.read_wav(str(wavs / "low.wav"))
    expected = recipe.log_mel(np.concatenate([signal, np.zeros(32000 - len(signal))]), 16000, 40)
    assert np.array_equal(ds.get("low")["mel"].numpy(), expected)  # stored exactly as computed


@pytest.mark.parametrize("name", RECIPES)
def test_each_byo_recipe_imports_only_installed_packages(name):
    import ast

    script = ROOT / f"{name}.py"
    siblings = {p.stem for p in ROOT.glob("*.py")}
    tree = ast.parse(script.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & siblings and "sys.path" not in script.read_text(encoding="utf-8")
