"""decode="nvjpeg": nvImageCodec's batched decode (the GPU's hardware JPEG engine, then its CUDA and
CPU backends) as the decode thread's backend (loader/decode_ahead.py); `shardkit[gpu-cu12]` or
`shardkit[gpu-cu13]`."""

from __future__ import annotations

import contextlib

import torch

INSTALL = "pip install 'shardkit[gpu-cu12]' (CUDA 12) or 'shardkit[gpu-cu13]' (CUDA 13)"


def load_backend():
    """(an NvImageCodec backend, "") or (None, why not): no CUDA device, or no nvImageCodec."""
    if not torch.cuda.is_available():
        return None, "CUDA is not available"
    try:
        from nvidia import nvimgcodec
    except ImportError:
        return None, f"nvImageCodec is not installed ({INSTALL})"
    try:
        return NvImageCodec(nvimgcodec), ""
    except Exception as e:  # a driver or library mismatch: say it, let the caller fall back
        return None, f"nvImageCodec could not start: {type(e).__name__}: {e}"


class NvImageCodec:
    """One nvImageCodec decoder on its own CUDA stream.

    Backends in order of preference: the hardware engine (baseline 4:2:0/4:2:2/4:4:4 JPEG on
    A100/H100/H200), the hybrid and CUDA ones (progressive JPEG, and what the engine refuses),
    the CPU one. nvImageCodec hands each image to the first backend that takes it, so a JPEG the
    engine cannot take is decoded by another without error.
    """

    def __init__(self, nvimgcodec, device: int | None = None):
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else device)
        kinds = ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU", "CPU_ONLY")
        backends = [nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, k)) for k in kinds
                    if hasattr(nvimgcodec.BackendKind, k)]
        self.decoder = nvimgcodec.Decoder(device_id=self.device.index, backends=backends)
        spec = nvimgcodec.ColorSpec
        rgb = getattr(spec, "SRGB", None) or spec.RGB  # SRGB in recent releases, RGB in older ones
        self.params = nvimgcodec.DecodeParams(color_spec=rgb, allow_any_depth=False)
        self.stream = torch.cuda.Stream(self.device)
        self._codestream = nvimgcodec.CodeStream

    def fence(self):
        """Training thread: the consumer's stream and an event after all it has queued so far."""
        consumer = torch.cuda.current_stream(self.device)
        return consumer, consumer.record_event()

    @contextlib.contextmanager
    def scope(self, token):
        consumer, queued = token
        # The hardware engine ignores the stream it is given and may overwrite memory the consumer
        # still reads: wait on the host (this thread; the GIL is released) for the consumer's queued
        # work, and make the decode stream wait for it too (the CUDA backend honours the stream).
        queued.synchronize()
        self.stream.wait_event(queued)
        handed = []  # the batch's tensors, as the decode thread assembles them
        with torch.cuda.stream(self.stream):
            yield handed
        # The batch's kernels (stack, resize) read nvImageCodec's buffers: done before they go.
        self.stream.synchronize()
        for t in handed:
            t.record_stream(consumer)  # the allocator keeps them until the consumer's uses are done

    def decode(self, blobs):
        """Encoded images -> (3,H,W) uint8 CUDA tensors (None: not decoded), in one native call."""
        streams = [self._codestream(b.tobytes()) for b in blobs]  # parses the headers: what each backend can take
        images = self.decoder.decode(streams, params=self.params, cuda_stream=self.stream.cuda_stream)
        return [None if im is None else torch.from_dlpack(im).permute(2, 0, 1) for im in images]
