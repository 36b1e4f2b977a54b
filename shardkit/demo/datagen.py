"""Generated raw folders for the demo, tests and benchmarks: photo-like images, text, and bad files."""

from __future__ import annotations

import io
import json
import os

_WORDS = ("data shard stream batch epoch tensor model train loss learn image text token cache worker "
          "queue buffer label class sample vector weight layer grad step rate time fast slow block disk "
          "memory network signal pattern value field record index order random seed hash river mountain "
          "forest city light dark cloud stone paper music story garden window bridge market winter").split()


def photo_like(rng, width: int, height: int):
    """A smooth, photo-like RGB image: gradients, soft blobs and sensor noise (compresses like a photo)."""
    import numpy as np
    from PIL import Image, ImageFilter

    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    x /= max(width, 1)
    y /= max(height, 1)
    colours = rng.uniform(0, 255, size=(3, 3)).astype(np.float32)
    img = colours[0] + (colours[1] - colours[0]) * x[..., None] + (colours[2] - colours[0]) * y[..., None]
    for _ in range(int(rng.integers(3, 7))):
        cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
        blob = np.exp(-(((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r)))
        img += blob[..., None] * rng.uniform(-120, 120, size=3).astype(np.float32)
    freq = rng.uniform(4, 20)
    img += 12 * np.sin(freq * x + rng.uniform(0, 6))[..., None]
    img += rng.normal(0, 6, size=img.shape).astype(np.float32)
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
    return im.filter(ImageFilter.GaussianBlur(0.6))


def words(rng, n: int) -> str:
    return " ".join(_WORDS[int(i)] for i in rng.zipf(1.3, size=n) % len(_WORDS))


def _jpeg(im, quality: int = 90, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


def _write(path: str, data: bytes | str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def generated(root, make, what: str) -> None:
    """Generate `root` once with make(folder) unless it exists (benchmark inputs are reused). It is
    made under ROOT.partial and renamed when complete, so a stopped run never leaves a short folder."""
    import shutil
    import sys

    root = str(root)
    if os.path.exists(root):
        return
    print(f"generating {what} in {root} …", file=sys.stderr)
    partial = root.rstrip(os.sep) + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    make(partial)
    os.rename(partial, root)


def image_folder(root: str, *, n: int, classes: int = 10, size: tuple[int, int] = (500, 375),
                 seed: int = 0, quality: int = 90) -> int:
    """n photo-like JPEGs of about `size`, spread over `classes` class folders; returns n."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for i in range(n):
        w = int(size[0] * rng.uniform(0.9, 1.1))
        h = int(size[1] * rng.uniform(0.9, 1.1))
        _write(os.path.join(root, f"class_{i % classes:02d}", f"{i:06d}.jpg"), _jpeg(photo_like(rng, w, h), quality))
    return n


def _edge_cases(root: str, rng) -> dict[str, str]:
    """Inputs every real folder eventually holds; value = what the build should do with it."""
    from PIL import Image

    base = photo_like(rng, 320, 240)
    good = _jpeg(base)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to display
    import numpy as np

    buf16, bufp = io.BytesIO(), io.BytesIO()
    Image.fromarray((np.linspace(0, 65535, 200 * 150).reshape(150, 200)).astype(np.uint16)).save(buf16, "PNG")
    pal = base.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    pal.save(bufp, "PNG", transparency=0)
    cases = {
        "cat/truncated.jpg": (good[: len(good) // 2], "rejected: truncated image"),
        "cat/empty.jpg": (b"", "rejected: empty file"),
        "dog/not_an_image.jpg": (b"this is a text file with a .jpg name\n", "rejected: undecodable image"),
        "dog/cmyk.jpg": (_jpeg(base.convert("CMYK")), "converted from CMYK"),
        "bird/deep16.png": (buf16.getvalue(), "converted from 16-bit grey"),
        "bird/palette_alpha.png": (bufp.getvalue(), "converted from palette with transparency"),
        "cat/rotated.jpg": (_jpeg(base, exif=exif.tobytes()), "rotated by its EXIF orientation"),
        "cat/café au lait.jpg": (good, "kept; key sanitised"),
        "dog/nested/deep/puppy.jpg": (good, "kept; label from the first folder: dog"),
        "notes.xyz": (b"unknown format", "rejected: unsupported extension"),
        ".DS_Store": (b"\0\0\0\1Bud1", "rejected: hidden file"),
        "latin1.txt": ("naïve café".encode("latin-1"), "kept; invalid UTF-8 replaced and counted"),
    }
    for rel, (data, _) in cases.items():
        _write(os.path.join(root, rel), data)
    return {rel: what for rel, (_, what) in cases.items()}


def raw_folder(root: str, *, images_per_class: int = 20, classes=("bird", "cat", "dog"),
               documents: int = 12, bad: bool = True, seed: int = 0) -> dict:
    """A demo raw folder: class folders of JPEG/PNG images of varied sizes with a few sidecar
    .json/.txt captions, text documents, a .jsonl corpus, and (bad=True) deliberately bad files."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for c in classes:
        for i in range(images_per_class):
            w, h = int(rng.integers(160, 640)), int(rng.integers(120, 480))
            im = photo_like(rng, w, h)
            stem = os.path.join(root, c, f"{i:06d}")
            if i % 5 == 4:
                buf = io.BytesIO()
                im.save(buf, "PNG")
                _write(stem + ".png", buf.getvalue())
            else:
                _write(stem + ".jpg", _jpeg(im))
            if i % 4 == 0:
                _write(stem + ".json", json.dumps({"caption": words(rng, 8), "source": "generated"}))
            elif i % 4 == 1:
                _write(stem + ".txt", words(rng, 10))
    for i in range(documents):
        _write(os.path.join(root, f"doc_{i:03d}.txt"), words(rng, int(rng.integers(50, 300))))
    lines = [json.dumps({"text": words(rng, int(rng.integers(20, 120))), "id": i}) for i in range(documents)]
    if bad:
        lines += ["{not json", json.dumps({"body": "no text field here"})]
    _write(os.path.join(root, "corpus.jsonl"), "\n".join(lines) + "\n")
    cases = _edge_cases(root, rng) if bad else {}
    return {"classes": list(classes), "images": images_per_class * len(classes), "documents": documents,
            "edge_cases": cases}


def _camera_photo(rng, width: int, height: int):
    """A photo-like image at camera size: the smooth scene drawn at a third of the size, scaled up,
    with per-pixel sensor noise at full size (so it compresses and decodes like a real photo)."""
    import numpy as np
    from PIL import Image

    scene = photo_like(rng, max(8, width // 3), max(8, height // 3)).resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.asarray(scene).astype(np.int16)
    pixels += rng.integers(-6, 7, pixels.shape, dtype=np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def near_duplicate_photos(root: str, *, originals: int = 180, copies: int = 40, seed: int = 0,
                          width: tuple[int, int] = (2400, 4000)) -> dict:
    """A folder of camera-size photo-like JPEGs (q90, 2400-4000 px wide, 4:3 or 3:2, either way up)
    plus `copies` altered copies of distinct originals per kind: `resize` (half size), `q60`
    (re-encoded at quality 60), `crop` (2% off each side). Returns {kind: [(original, copy), …]},
    paths relative to root: the pairs a near-duplicate finder should report."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    names = []
    for i in range(originals):
        w = int(rng.integers(width[0], width[1] + 1))
        h = int(w * (3 / 4 if rng.random() < 0.5 else 2 / 3))
        w, h = (h, w) if rng.random() < 0.25 else (w, h)
        names.append(f"photo_{i:04d}.jpg")
        _write(os.path.join(root, names[-1]), _jpeg(_camera_photo(rng, w, h)))
    truth: dict[str, list] = {"resize": [], "q60": [], "crop": []}
    picks = rng.permutation(originals)[: 3 * copies].reshape(3, copies) if originals >= 3 * copies else None
    for k, kind in enumerate(truth):
        for j in range(copies):
            src = names[int(picks[k, j]) if picks is not None else int(rng.integers(originals))]
            with Image.open(os.path.join(root, src)) as im:
                im = im.convert("RGB")
                w, h = im.size
                if kind == "resize":
                    data = _jpeg(im.resize((w // 2, h // 2), Image.Resampling.BICUBIC))
                elif kind == "q60":
                    data = _jpeg(im, quality=60)
                else:
                    dx, dy = w // 50, h // 50
                    data = _jpeg(im.crop((dx, dy, w - dx, h - dy)))
            copy = f"copy_{kind}_{j:03d}.jpg"
            _write(os.path.join(root, copy), data)
            truth[kind].append((src, copy))
    return truth
