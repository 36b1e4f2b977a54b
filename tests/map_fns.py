"""User functions for build_map tests, in a module worker processes can import."""

from __future__ import annotations

import io
import os
import signal

import numpy as np


def make(i):
    """A sample per input; input 37 raises, input 5 is skipped, input 11 gives two samples."""
    if i == 37:
        raise ValueError(f"bad input {i}\nno such thing as input {i}")
    if i == 5:
        return None
    if os.environ.get("MAP_KILL_AT") == str(i):  # the kill -9 test: the process dies mid-run
        os.kill(os.getpid(), signal.SIGKILL)
    sample = {"__key__": f"k{i:05d}", "arr": np.full((3,), i, np.int32), "cls": i, "txt": f"t{i}",
              "png": _png(i)}
    if i == 11:
        return [sample, dict(sample, __key__="k00011x")]
    return sample


def _png(i: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), i % 256, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def wrong_kind(i):
    """Input 3 gives a text where the field holds ints."""
    return {"__key__": f"k{i:03d}", "cls": "three" if i == 3 else i}


def same_key_in_group(i):
    return {"__key__": "same" if i in (2, 4) else f"k{i:03d}", "cls": i}


def same_key_across(i):
    return {"__key__": "same" if i in (1, 8) else f"k{i:03d}", "cls": i}


def other_make(i):
    return {"__key__": f"k{i:05d}", "cls": i + 1}


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return {"__key__": os.path.basename(path).split(".")[0], "txt": f.read()}


def caption_length(sample):
    """For `shardkit build --map`: adds a field; a sample whose key ends in 3 raises, one ending in 4 is dropped."""
    if sample["__key__"].endswith("3"):
        raise RuntimeError(f"cannot caption {sample['__key__']}")
    if sample["__key__"].endswith("4"):
        return None
    return dict(sample, n=len(sample["__key__"]))


def surrogate_at_4(i):
    """Input 4 gives a text UTF-8 cannot store (a lone surrogate)."""
    return {"__key__": f"k{i:03d}", "txt": "bad \ud800" if i == 4 else f"text {i}"}


def skip_below_10(i):
    """A filter: inputs 0-9 (the whole first group of 10) are skipped."""
    return None if i < 10 else {"__key__": f"k{i:03d}", "cls": i}
