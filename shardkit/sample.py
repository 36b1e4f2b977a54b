"""The one sample type shared by every stage, writer and reader."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9_\-/]")


@dataclass(slots=True)
class Sample:
    """key: unique, dot-free, stable; fields: name -> value; meta: provenance, never written."""

    key: str
    fields: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def make_key(rel_stem: str) -> str:
    """Sanitised key for a relative path without extension.

    WebDataset splits member names on the first dot, so keys never hold one. Anything outside
    [A-Za-z0-9_-/] becomes '_'; when sanitising changed the name, a short hash of the original
    is appended so that distinct inputs never collide (e.g. 'a.b' vs 'a_b').
    """
    rel_stem = rel_stem.replace("\\", "/")
    ascii_stem = unicodedata.normalize("NFKD", rel_stem).encode("ascii", "ignore").decode()
    safe = _UNSAFE.sub("_", ascii_stem).strip("/") or "_"
    if safe == rel_stem:
        return safe
    digest = hashlib.sha1(rel_stem.encode("utf-8")).hexdigest()[:8]
    return f"{safe}_{digest}"


def check_key(key: str) -> str:
    """Validate a key produced elsewhere (e.g. by a user transform)."""
    if not key or "." in key or key.startswith("/") or _UNSAFE.search(key):
        raise ValueError(
            f"invalid sample key {key!r}: keys are non-empty, hold only [A-Za-z0-9_-/] and no dot "
            "(WebDataset splits member names on the first dot); build keys with shardkit.sample.make_key"
        )
    return key
