"""The image fast path rests on private PIL calls: with each one taken away, batches stay identical."""

from __future__ import annotations

import io
import types

import numpy as np
import PIL
import pytest
import torch
from PIL import Image

from shardkit.demo.datagen import photo_like
from shardkit.reader import decode

# Every private PIL name the fast path touches ("core.new": Image.core.new).
PRIVATE = ["_getdecoder", "_getencoder", "_decompression_bomb_check", "core.new"]


def _without(module, names):
    """A stand-in for `module` lacking `names` (dotted: inside a sub-namespace); all else forwarded.
    PIL's own code keeps the real module (Image.open uses these names itself)."""
    attrs = {k: getattr(module, k) for k in dir(module)}
    for name in names:
        head, _, rest = name.partition(".")
        if rest:
            attrs[head] = _without(attrs[head], [rest])
        else:
            attrs.pop(head)
    return types.SimpleNamespace(**attrs)


def hide(monkeypatch, *names):
    """Take the private names away from shardkit's decoder, as a Pillow without them would."""
    monkeypatch.setattr(decode, "Image", _without(Image, names))


def _blob(im, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def blobs() -> list[bytes]:
    """Same-size images in every form the decoder meets: baseline/progressive RGB JPEG (fast path),
    grayscale and CMYK JPEG, PNG with alpha, WebP (public path)."""
    rng = np.random.default_rng(0)
    ims = [photo_like(rng, 40, 30) for _ in range(6)]
    return [_blob(ims[0], "JPEG", quality=90), _blob(ims[1], "JPEG", quality=80, progressive=True),
            _blob(ims[2].convert("L"), "JPEG"), _blob(ims[3].convert("CMYK"), "JPEG"),
            _blob(ims[4].convert("RGBA"), "PNG"), _blob(ims[5], "WEBP", quality=90)]


class Spy:
    """Counts what the fast-path helpers returned: arrays (fast path taken) or None (fell back)."""

    def __init__(self, monkeypatch):
        self.results = {"_decode_jpeg": [], "_pack": []}
        for name in self.results:
            monkeypatch.setattr(decode, name, self._wrap(name, getattr(decode, name)))

    def _wrap(self, name, fn):
        def spy(*args):
            out = fn(*args)
            self.results[name].append(out is not None)
            return out
        return spy


def _batch(blobs):
    return decode.images(blobs)


def test_fast_path_is_taken_on_the_installed_pillow(blobs, monkeypatch):
    """The README names the Pillow versions the fast path is verified on: this is the check."""
    spy = Spy(monkeypatch)
    batch = _batch(blobs)
    assert isinstance(batch, torch.Tensor) and batch.shape == (6, 3, 30, 40)
    assert spy.results["_decode_jpeg"] == [True, True], f"fast JPEG path lost on Pillow {PIL.__version__}"
    assert spy.results["_pack"] == [True, True]


@pytest.mark.parametrize("name", PRIVATE)
def test_each_private_call_taken_away_gives_the_same_batch(blobs, monkeypatch, name):
    want = _batch(blobs)
    hide(monkeypatch, name)
    spy = Spy(monkeypatch)
    got = _batch(blobs)
    assert torch.equal(got, want)
    assert spy.results["_decode_jpeg"] == [False, False]  # both RGB JPEGs took the public path
    if name != "_getencoder":  # without the encoder the decoder is not even tried
        assert spy.results["_pack"] == []


def test_everything_private_gone_is_np_asarray(blobs, monkeypatch):
    """The last fallback is the public one: the batch equals np.asarray over PIL's own decode."""
    hide(monkeypatch, *PRIVATE)
    got = _batch(blobs)
    want = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs])
    assert torch.equal(got, torch.from_numpy(want).permute(0, 3, 1, 2))


def test_a_misbehaving_encoder_falls_back(blobs, monkeypatch):
    """A private call that exists but returns something else (a future Pillow) is not trusted."""
    want = _batch(blobs)
    real = Image._getencoder

    class Short:
        def __init__(self, enc):
            self.enc = enc

        def setimage(self, *a):
            self.enc.setimage(*a)

        def encode(self, n):
            _, status, data = self.enc.encode(n // 2)  # hands back half the image
            return len(data), status, data

        def cleanup(self):
            self.enc.cleanup()

    stand_in = _without(Image, [])
    stand_in._getencoder = lambda *a: Short(real(*a))
    monkeypatch.setattr(decode, "Image", stand_in)
    spy = Spy(monkeypatch)
    assert torch.equal(_batch(blobs), want)
    assert spy.results["_pack"] == [False, False]


def test_bad_bytes_still_raise_on_the_public_path(blobs, monkeypatch):
    truncated = blobs[0][: len(blobs[0]) // 2]
    with pytest.raises(decode.DecodeFailed):
        decode.images([blobs[1], truncated])
    hide(monkeypatch, "_getdecoder")
    with pytest.raises(decode.DecodeFailed):
        decode.images([blobs[1], truncated])


def test_streamed_batches_are_the_same_without_the_private_calls(tmp_path, monkeypatch):
    from factory import make_dataset

    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    root, _ = make_dataset(tmp_path, 20, shards=2, fields=("jpg", "cls"))

    def read():
        loader = make_loader(StreamingDataset(root, seed=3, fields=["jpg", "cls"]), batch_size=8, num_workers=0)
        return [(b["__key__"], b["jpg"].clone(), b["cls"]) for b in loader]

    want = read()
    hide(monkeypatch, *PRIVATE)
    got = read()
    assert [k for k, _, _ in got] == [k for k, _, _ in want]
    for (_, x, y), (_, wx, wy) in zip(got, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)


# -- make_loader(decode="cuda"): workers ship JPEGs encoded, the main process decodes them on the GPU

@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    from factory import make_dataset

    return make_dataset(tmp_path_factory.mktemp("jpegs"), 23, shards=3, fields=("jpg", "cls"))


def _batches(root, monkeypatch, decode_on="cpu", workers=2):
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    loader = make_loader(StreamingDataset(root, fields=["jpg", "cls"], seed=1), batch_size=4, num_workers=workers,
                         prefetch_factor=2, decode=decode_on)
    return loader, [(b["__key__"], b["jpg"].clone(), b["cls"].clone()) for b in loader]


def _same(a, b):
    assert [k for k, _, _ in a] == [k for k, _, _ in b]
    assert all(torch.equal(x, y) and torch.equal(p, q) for (_, x, p), (_, y, q) in zip(a, b))


def _pil_decoder(calls):
    """A stand-in for nvJPEG (torchvision.io.decode_jpeg(list, device='cuda')): CHW uint8 tensors."""
    def decode_list(tensors):
        calls.append(len(tensors))
        return [torch.from_numpy(decode.decode_image(t.numpy().tobytes()).copy()).permute(2, 0, 1) for t in tensors]
    return decode_list


def test_gpu_decode_without_cuda_warns_once_and_decodes_in_the_workers(jpegs, monkeypatch, caplog):
    root, _ = jpegs
    _, want = _batches(root, monkeypatch)
    with caplog.at_level("WARNING", logger="shardkit.loader.gpu_decode"):
        loader, got = _batches(root, monkeypatch, "cuda")
    lines = [r.getMessage() for r in caplog.records if r.name == "shardkit.loader.gpu_decode"]
    assert lines == ["decode='cuda' falls back to decoding on the CPU in the workers: CUDA is not available"]
    assert not loader._transport.ship_encoded
    _same(got, want)


def test_gpu_decode_ships_encoded_images_and_decodes_them_in_the_main_process(jpegs, monkeypatch):
    from shardkit.loader import gpu_decode

    root, _ = jpegs
    _, want = _batches(root, monkeypatch)
    calls = []
    monkeypatch.setattr(gpu_decode, "gpu_decoder", lambda: (_pil_decoder(calls), ""))
    loader, got = _batches(root, monkeypatch, "cuda")
    assert loader._transport.ship_encoded and calls == [4] * 5 + [3]  # every batch decoded here, none in workers
    _same(got, want)


def test_a_batch_the_gpu_refuses_is_decoded_on_the_cpu_with_one_warning(jpegs, monkeypatch, caplog):
    from shardkit.loader import gpu_decode

    root, _ = jpegs
    _, want = _batches(root, monkeypatch)

    def refuse(tensors):
        raise RuntimeError("nvJPEG: unsupported image")

    monkeypatch.setattr(gpu_decode, "gpu_decoder", lambda: (refuse, ""))
    with caplog.at_level("WARNING", logger="shardkit.loader.gpu_decode"):
        _, got = _batches(root, monkeypatch, "cuda")
    lines = [r.getMessage() for r in caplog.records if r.name == "shardkit.loader.gpu_decode"]
    assert len(lines) == 1 and "nvJPEG: unsupported image" in lines[0]
    _same(got, want)


def test_gpu_decode_options_are_checked(jpegs, monkeypatch):
    from shardkit.errors import ConfigError
    from shardkit.loader import gpu_decode, make_loader
    from shardkit.reader.dataset import StreamingDataset

    root, _ = jpegs
    ds = StreamingDataset(root, fields=["jpg", "cls"])
    with pytest.raises(ConfigError, match="decode=.jpeg2000.: expected .cpu."):
        make_loader(ds, batch_size=4, num_workers=0, decode="jpeg2000")
    monkeypatch.setattr(gpu_decode, "gpu_decoder", lambda: (_pil_decoder([]), ""))
    transformed = StreamingDataset(root, fields=["jpg", "cls"], batch_transform=lambda b: b)
    with pytest.raises(ConfigError, match="transform / batch_transform would see encoded bytes"):
        make_loader(transformed, batch_size=4, num_workers=2, decode="cuda")


def test_encoded_batches_keep_missing_images_and_bytes():
    enc = decode.Encoded([b"abc", None, b"de"])
    assert len(enc) == 3 and enc.missing == [1]
    assert [None if b is None else b.tobytes() for b in enc.blobs()] == [b"abc", None, b"de"]
