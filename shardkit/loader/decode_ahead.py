"""A decode thread in the main process: batch N+1's images are decoded while the step runs on batch N.

The workers ship images encoded (reader.decode.Encoded). The thread takes each batch's images in
one call to a backend (loader/nvjpeg.py: nvImageCodec on the GPU, which releases the GIL in its
native call), so the training loop's thread keeps launching kernels meanwhile. Batches leave in
the order they came; the loader counts a batch only when it yields it, so a batch decoded ahead
and never yielded (a `break`) is read again on resume, as without the thread.

A backend is small and pluggable (tests inject a CPU one):
- `fence()`, in the training thread when a batch is handed to the thread: a token saying what
  the consumer's stream has queued so far (None on the CPU);
- `scope(token)`, a context manager the thread decodes and assembles the batch in (on its own
  stream, after the consumer's work it must not overwrite); it gives a list the thread adds the
  batch's tensors to, which are safe to use on the consumer's stream once it is left;
- `decode(blobs)`: encoded images (numpy uint8 views) -> (3,H,W) uint8 tensors on the device,
  None for an image the backend could not take (decoded on the CPU here instead);
- `device`: where the tensors are.
"""

from __future__ import annotations

import collections
import logging
from concurrent.futures import ThreadPoolExecutor

import torch

from shardkit.errors import ShardkitError
from shardkit.reader.decode import Encoded, decode_image

log = logging.getLogger(__name__)


class DecodeError(ShardkitError):
    """An image the decode thread could not decode, on any backend: names the sample's key."""


class DecodeAhead:
    """Runs a backend on a thread of its own, `depth` batches ahead of the training loop."""

    def __init__(self, backend, depth: int = 1):
        self.backend = backend
        self.depth = depth
        self.cpu_fallbacks = 0  # images the backend refused, decoded on the CPU instead
        self.warned = False

    def run(self, batches):
        """Yield `batches` (dicts with Encoded columns) decoded, in order."""
        pool = ThreadPoolExecutor(1, thread_name_prefix="shardkit-decode")
        pending = collections.deque()
        try:
            for batch in batches:
                pending.append(pool.submit(self.decode_batch, batch, self.backend.fence()))
                if len(pending) > self.depth:
                    yield pending.popleft().result()  # re-raises the thread's error here
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:  # a break or an error: nothing more is decoded
                future.cancel()
            pool.shutdown(wait=False)

    def decode_batch(self, batch, token):
        """The decode thread: every Encoded column of a batch -> device tensors."""
        if not isinstance(batch, dict) or not any(isinstance(v, Encoded) for v in batch.values()):
            return batch
        out = dict(batch)
        with self.backend.scope(token) as handed:
            for name, value in batch.items():
                if isinstance(value, Encoded):
                    out[name] = self._column(name, value, batch.get("__key__"))
                    col = out[name]
                    handed += [t for t in col if t is not None] if isinstance(col, list) else [col]
        return out

    def _column(self, name: str, enc: Encoded, keys):
        blobs = enc.blobs()
        present = [i for i, b in enumerate(blobs) if b is not None]
        try:
            decoded = list(self.backend.decode([blobs[i] for i in present])) if present else []
        except Exception as e:  # the whole call failed: try each image, to name the one at fault
            if not self.warned:
                self.warned = True  # one line, not one per batch
                log.warning("a batch decode failed (%s: %s): such batches are decoded image by image",
                            type(e).__name__, e)
            decoded = [self._one(blobs[i], name, i, keys, e) for i in present]
        if len(decoded) != len(present):
            raise DecodeError(f"the decoder returned {len(decoded)} images for {len(present)} of field {name!r}")
        out = [None] * len(blobs)
        for i, t in zip(present, decoded):
            out[i] = t if t is not None else self._on_cpu(blobs[i], name, i, keys)
        return assemble(out)

    def _one(self, blob, name, i, keys, cause):
        try:
            (t,) = self.backend.decode([blob])
            return t
        except Exception:
            return self._on_cpu(blob, name, i, keys, cause)

    def _on_cpu(self, blob, name, i, keys, cause=None):
        """An image the backend refused (e.g. a JPEG the engine cannot take): decoded by PIL."""
        try:
            arr = decode_image(blob.tobytes())
        except Exception as e:
            key = keys[i] if isinstance(keys, (list, tuple)) and i < len(keys) else f"#{i} of its batch"
            raise DecodeError(f"could not decode field {name!r} of sample {key!r}: {cause or e} (CPU: "
                              f"{type(e).__name__}: {e}); rebuild the dataset or drop that sample") from e
        self.cpu_fallbacks += 1
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).to(self.backend.device, non_blocking=False)


def assemble(images: list):
    """(3,H,W) tensors -> one (B,3,H,W) batch, images of another size resized (shorter side) and
    center-cropped to the batch's most common size on their device; a list where some are missing."""
    if any(t is None for t in images):
        return images
    if not images:
        return images
    sizes = collections.Counter(tuple(t.shape[1:]) for t in images)
    size = sizes.most_common(1)[0][0]
    return torch.stack([t if tuple(t.shape[1:]) == size else fit(t, size) for t in images])


def fit(image, size: tuple[int, int]):
    """A (3,H,W) uint8 image resized so it covers `size` (bilinear, antialiased), then center-cropped."""
    h, w = image.shape[1:]
    th, tw = size
    scale = max(th / h, tw / w)
    nh, nw = max(th, round(h * scale)), max(tw, round(w * scale))
    resized = torch.nn.functional.interpolate(image[None].float(), size=(nh, nw), mode="bilinear",
                                              antialias=True, align_corners=False)[0]
    top, left = (nh - th) // 2, (nw - tw) // 2
    return resized[:, top:top + th, left:left + tw].round().clamp(0, 255).to(torch.uint8)
