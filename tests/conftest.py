"""Shared fixtures: generated raw folders and build helpers (all data lives in tmp_path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def raw_folder(tmp_path) -> Path:
    """A small demo folder: 3 classes × 6 images with sidecars, text, jsonl and the edge cases."""
    from shardkit.demo.datagen import raw_folder as make

    root = tmp_path / "raw"
    make(str(root), images_per_class=6, documents=4, bad=True, seed=1)
    return root


def tree_bytes(root: Path, skip=(".shardkit",)) -> dict[str, bytes]:
    """Every file under root (relative path → bytes), leaving out the build state folder."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in filenames:
            full = Path(dirpath) / name
            out[str(full.relative_to(root))] = full.read_bytes()
    return out
