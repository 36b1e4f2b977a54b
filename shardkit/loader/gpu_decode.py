"""make_loader's decode option. "cuda": a batch's JPEGs, shipped encoded by the workers, decoded on
the GPU (nvJPEG through torchvision.io.decode_jpeg), with the CPU decode as the fallback;
"nvjpeg": nvImageCodec on a decode thread (loader/nvjpeg.py, loader/decode_ahead.py); "auto":
the first of nvImageCodec, torchvision, the CPU workers that can run here, recorded in
memory.PATHS["decode"]."""

from __future__ import annotations

import logging

import torch

from shardkit.loader import memory, nvjpeg
from shardkit.reader.decode import Encoded, images

log = logging.getLogger(__name__)

DECODE_ON = ("cpu", "cuda", "nvjpeg", "auto")
INSTALL = "pip install 'shardkit[gpu]'"


def gpu_decoder():
    """torchvision's batched nvJPEG decode, or None (with why) where torchvision or CUDA is absent."""
    if not torch.cuda.is_available():
        return None, "CUDA is not available"
    try:
        from torchvision.io import decode_jpeg
    except ImportError:
        return None, f"torchvision is not installed ({INSTALL})"
    return lambda blobs: decode_jpeg(blobs, device="cuda"), ""


def choose(decode: str, num_workers: int = 1):
    """make_loader's decode option -> the decoder to use: None (decode in the workers), a callable
    (torchvision's, run where the batch is unpacked) or a decode thread's backend (nvImageCodec:
    it has `scope`). "cuda" where it cannot run warns once and falls back to the workers' CPU
    decode; "nvjpeg" where it cannot run is a ConfigError; "auto" takes the first that runs."""
    if decode not in DECODE_ON:
        from shardkit.errors import ConfigError

        raise ConfigError(f"decode={decode!r}: expected 'cpu' (in the workers), 'cuda' (torchvision's nvJPEG on "
                          f"the GPU, needs {INSTALL}), 'nvjpeg' (nvImageCodec on the GPU, needs {nvjpeg.INSTALL}) "
                          "or 'auto' (the first of these that runs here) (make_loader(decode=...))")
    if decode == "cpu" or not num_workers:
        why = "decode='cpu'" if decode == "cpu" else "num_workers=0: no workers to ship encoded images"
        if decode == "nvjpeg":
            from shardkit.errors import ConfigError

            raise ConfigError("decode='nvjpeg' needs num_workers >= 1 (the workers ship the encoded images): "
                              "set num_workers, or use decode='cpu'")
        memory.PATHS["decode"] = f"cpu workers: {why}"
        return None
    if decode in ("nvjpeg", "auto"):
        backend, why = nvjpeg.load_backend()
        if backend is not None:
            memory.PATHS["decode"] = "nvimgcodec"
            return backend
        if decode == "nvjpeg":
            from shardkit.errors import ConfigError

            raise ConfigError(f"decode='nvjpeg' cannot run here: {why}. Install the extra ({nvjpeg.INSTALL}) on a "
                              "machine with an NVIDIA GPU, or use decode='auto', which falls back to torchvision's "
                              "nvJPEG, then to decoding on the CPU in the workers")
    return _torchvision_or_cpu(decode, why if decode == "auto" else None)


def _torchvision_or_cpu(decode: str, why: str | None):
    """choose's last resort for "cuda" and "auto": torchvision's nvJPEG decoder, else None (the CPU
    workers decode), the path taken recorded in memory.PATHS; `why`: why nvImageCodec did not run ("auto")."""
    decoder, why_tv = gpu_decoder()
    if decoder is None:
        if decode == "auto":
            memory.PATHS["decode"] = f"cpu workers: nvImageCodec: {why}; torchvision: {why_tv}"
            log.info("decode='auto' decodes on the CPU in the workers (nvImageCodec: %s; torchvision: %s)", why, why_tv)
        else:
            memory.PATHS["decode"] = f"cpu workers: {why_tv}"
            log.warning("decode='cuda' falls back to decoding on the CPU in the workers: %s", why_tv)
        return None
    memory.PATHS["decode"] = "torchvision" + (f" (nvImageCodec: {why})" if decode == "auto" else "")
    if decode == "auto":
        log.info("decode='auto' decodes with torchvision's nvJPEG (nvImageCodec: %s)", why)
    return decoder


class BatchDecoder:
    """Main side: Encoded columns of a batch -> (B,3,H,W) uint8 tensors on the GPU."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.warned = False

    def __call__(self, enc: Encoded):
        blobs = enc.blobs()
        present = [torch.from_numpy(b) for b in blobs if b is not None]
        try:
            decoded = iter(self.decoder(present) if present else [])
        except (RuntimeError, ValueError) as e:  # e.g. a PNG or a CMYK JPEG nvJPEG refuses
            if not self.warned:
                self.warned = True  # one line, not one per batch
                log.warning("GPU decode failed (%s): such batches are decoded on the CPU in the main process", e)
            return images([None if b is None else b.tobytes() for b in blobs])
        out = [None if b is None else next(decoded) for b in blobs]
        if not enc.missing and len({tuple(t.shape) for t in out}) == 1:
            return torch.stack(out)
        return out  # a list, as the CPU decode gives for mixed sizes or missing images
