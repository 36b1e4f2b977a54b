"""decode="nvjpeg" / "auto": the options' checks and fallbacks, and the decode thread
(loader/decode_ahead.py) run with an injected CPU backend: order, exactly-once, resume, errors."""

from __future__ import annotations

import contextlib
import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from shardkit.errors import ConfigError
from shardkit.loader import gpu_decode, make_loader, memory, nvjpeg
from shardkit.loader.decode_ahead import DecodeAhead, DecodeError, assemble, fit
from shardkit.reader import decode
from shardkit.reader.dataset import StreamingDataset


class CpuBackend:
    """The decode thread's device part, on CPU tensors: what NvImageCodec does on a GPU."""

    device = torch.device("cpu")

    def __init__(self, refuse=(), fail_on=None):
        self.calls, self.threads, self.fences = [], set(), 0
        self.refuse, self.fail_on = refuse, fail_on  # refuse: images given back as None (CPU fallback)

    def fence(self):
        self.fences += 1
        return self.fences

    @contextlib.contextmanager
    def scope(self, token):
        yield []

    def decode(self, blobs):
        self.threads.add(threading.current_thread().name)
        self.calls.append(len(blobs))
        out = []
        for b in blobs:
            data = b.tobytes()
            if self.fail_on is not None and data == self.fail_on:
                raise RuntimeError("nvImageCodec: bad bitstream")
            arr = decode.decode_image(data)
            out.append(None if len(self.calls) in self.refuse else torch.from_numpy(arr.copy()).permute(2, 0, 1))
        return out


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    from factory import make_dataset

    return make_dataset(tmp_path_factory.mktemp("jpegs"), 23, shards=3, fields=("jpg", "cls"))


@pytest.fixture
def rank0(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")


def _loader(root, decode_on="cpu", workers=2, **ds):
    return make_loader(StreamingDataset(root, fields=["jpg", "cls"], seed=1, **ds), batch_size=4,
                       num_workers=workers, prefetch_factor=2, decode=decode_on)


def _read(loader):
    return [(b["__key__"], b["jpg"].clone(), b["cls"].clone()) for b in loader]


def _same(a, b):
    assert [k for k, _, _ in a] == [k for k, _, _ in b]
    assert all(torch.equal(x, y) and torch.equal(p, q) for (_, x, p), (_, y, q) in zip(a, b))


def test_nvjpeg_without_a_gpu_is_a_config_error_naming_the_extra_and_the_fallback(jpegs, rank0):
    root, _ = jpegs
    with pytest.raises(ConfigError, match=r"CUDA is not available.*shardkit\[gpu-cu12\].*decode='auto'"):
        _loader(root, "nvjpeg")


def test_nvjpeg_without_the_extra_is_a_config_error(jpegs, rank0, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "nvidia.nvimgcodec", None)  # import fails
    backend, why = nvjpeg.load_backend()
    assert backend is None and "shardkit[gpu-cu12]" in why and "shardkit[gpu-cu13]" in why
    monkeypatch.setattr(nvjpeg, "load_backend", lambda: (None, why))
    with pytest.raises(ConfigError, match=r"nvImageCodec is not installed.*falls back to torchvision's nvJPEG"):
        gpu_decode.choose("nvjpeg")
    with pytest.raises(ConfigError, match="num_workers >= 1"):
        gpu_decode.choose("nvjpeg", num_workers=0)


def test_auto_falls_back_to_the_cpu_workers_and_says_which_path(jpegs, rank0, caplog):
    root, _ = jpegs
    want = _read(_loader(root))
    with caplog.at_level("INFO", logger="shardkit.loader.gpu_decode"):
        loader = _loader(root, "auto")
    assert memory.PATHS["decode"].startswith("cpu workers: nvImageCodec: CUDA is not available")
    assert any("decode='auto' decodes on the CPU in the workers" in r.getMessage() for r in caplog.records)
    assert not loader._transport.ship_encoded
    _same(_read(loader), want)


def test_auto_takes_torchvision_when_nvimgcodec_is_missing(monkeypatch):
    monkeypatch.setattr(nvjpeg, "load_backend", lambda: (None, "nvImageCodec is not installed"))
    monkeypatch.setattr(gpu_decode, "gpu_decoder", lambda: ((lambda blobs: blobs), ""))
    assert gpu_decode.choose("auto") is not None
    assert memory.PATHS["decode"] == "torchvision (nvImageCodec: nvImageCodec is not installed)"


def test_decode_thread_keeps_order_and_gives_the_cpu_batches(jpegs, rank0, monkeypatch):
    root, _ = jpegs
    want = _read(_loader(root))
    backend = CpuBackend()
    monkeypatch.setattr(nvjpeg, "load_backend", lambda: (backend, ""))
    loader = _loader(root, "nvjpeg")
    assert loader._transport.ship_encoded and memory.PATHS["decode"] == "nvimgcodec"
    _same(_read(loader), want)
    assert backend.calls == [4] * 5 + [3]  # one call per whole batch, none in the workers
    assert backend.threads == {"shardkit-decode_0"}  # the decode thread, not the loop's thread


def test_decode_thread_exactly_once_and_resume(jpegs, rank0, monkeypatch):
    root, samples = jpegs
    monkeypatch.setattr(nvjpeg, "load_backend", lambda: (CpuBackend(), ""))
    full = _read(_loader(root))
    loader = _loader(root, "nvjpeg")
    first = []
    for i, batch in enumerate(loader):
        first.append((batch["__key__"], batch["jpg"].clone(), batch["cls"].clone()))
        if i == 2:
            break  # batch 3 was decoded ahead and never yielded: it must come again on resume
    state = loader.state_dict()
    again = _loader(root, "nvjpeg")
    again.load_state_dict(state)
    rest = _read(again)
    _same(first + rest, full)
    keys = [k for ks, _, _ in first + rest for k in ks]
    assert sorted(keys) == sorted(samples) and len(keys) == len(set(keys))


def test_an_image_the_backend_refuses_is_decoded_on_the_cpu_without_error(jpegs, rank0, monkeypatch):
    root, _ = jpegs
    want = _read(_loader(root))
    backend = CpuBackend(refuse={2})  # its 2nd call gives None for every image (e.g. progressive)
    monkeypatch.setattr(nvjpeg, "load_backend", lambda: (backend, ""))
    loader = _loader(root, "nvjpeg")
    _same(_read(loader), want)
    assert loader._ahead.cpu_fallbacks == 4


def test_a_decoder_error_fails_the_loader_with_the_samples_key(tmp_path, rank0, monkeypatch):
    from factory import make_dataset

    root, samples = make_dataset(tmp_path / "ds", 12, shards=2, fields=("jpg", "cls"))
    bad_key = sorted(samples)[5]
    monkeypatch.setattr(nvjpeg, "load_backend", lambda: (CpuBackend(fail_on=samples[bad_key].fields["jpg"]), ""))
    # The stored bytes decode on the CPU; break them there too so no backend can take them.
    real = decode.decode_image

    def cpu(data):
        if data == samples[bad_key].fields["jpg"]:
            raise OSError("broken data stream")
        return real(data)
    monkeypatch.setattr("shardkit.loader.decode_ahead.decode_image", cpu)
    with pytest.raises(DecodeError, match=f"sample '{bad_key}'.*bad bitstream"):
        _read(_loader(root, "nvjpeg"))


def test_decode_thread_error_propagates_instead_of_hanging():
    class Boom(CpuBackend):
        def decode(self, blobs):
            raise MemoryError("out of device memory")

    def batches():
        for i in range(5):
            yield {"jpg": decode.Encoded([b"not a jpeg"]), "__key__": [f"k{i}"]}

    with pytest.raises(DecodeError, match="sample 'k0': out of device memory"):
        list(DecodeAhead(Boom()).run(batches()))


def _jpeg(size, color=(200, 30, 30)):
    buf = io.BytesIO()
    Image.new("RGB", (size[1], size[0]), color).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def test_mixed_sizes_are_resized_and_cropped_to_the_batchs_size():
    a = torch.full((3, 8, 12), 100, dtype=torch.uint8)
    b = torch.full((3, 16, 16), 100, dtype=torch.uint8)
    out = assemble([a, a.clone(), b])
    assert out.shape == (3, 3, 8, 12) and int(out[2].float().mean().round()) == 100
    assert fit(b, (8, 12)).dtype == torch.uint8
    assert isinstance(assemble([a, None]), list)


def test_nvimgcodec_backend_runs_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA and nvImageCodec (bench/device_run.sh runs this on a device)")
    backend, why = nvjpeg.load_backend()
    if backend is None:
        pytest.skip(why)
    blobs = [np.frombuffer(_jpeg((32, 48)), np.uint8), np.frombuffer(_jpeg((32, 48), (10, 220, 10)), np.uint8)]
    ahead = DecodeAhead(backend)
    (batch,) = list(ahead.run(iter([{"jpg": decode.Encoded(blobs), "__key__": ["a", "b"]}])))
    want = torch.stack([torch.from_numpy(decode.decode_image(b.tobytes()).copy()).permute(2, 0, 1) for b in blobs])
    assert batch["jpg"].is_cuda and batch["jpg"].shape == (2, 3, 32, 48)
    assert (batch["jpg"].cpu().int() - want.int()).abs().float().mean() < 3  # decoders round differently
