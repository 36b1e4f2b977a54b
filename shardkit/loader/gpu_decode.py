"""decode="cuda": a batch's JPEGs, shipped encoded by the workers, decoded on the GPU (nvJPEG
through torchvision.io.decode_jpeg), with the CPU decode as the fallback."""

from __future__ import annotations

import logging

import torch

from shardkit.reader.decode import Encoded, images

log = logging.getLogger(__name__)

DECODE_ON = ("cpu", "cuda")
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


def choose(decode: str):
    """make_loader's decode option -> the GPU decoder to use, or None: decode in the workers.
    Asking for "cuda" where it cannot run warns once and falls back to the workers' CPU decode."""
    if decode not in DECODE_ON:
        from shardkit.errors import ConfigError

        raise ConfigError(f"decode={decode!r}: expected 'cpu' (in the workers) or 'cuda' (nvJPEG on the GPU, "
                          f"needs {INSTALL}) (make_loader(decode=...))")
    if decode == "cpu":
        return None
    decoder, why = gpu_decoder()
    if decoder is None:
        log.warning("decode='cuda' falls back to decoding on the CPU in the workers: %s", why)
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
