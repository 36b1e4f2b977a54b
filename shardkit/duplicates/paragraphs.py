"""Paragraphs repeated across documents, as dolma's paragraph dedup finds them, without its Bloom
filter's order dependence: a paragraph is a non-blank line (stripped), and of each set of equal
paragraphs the one in the first document in key order (then the first line) stays; every later
copy is removed from its document. Pure functions: hashes, hash-range files, decisions."""

from __future__ import annotations

import numpy as np
import xxhash

from shardkit.contract import key_hash

ENTRY = np.dtype([("h", "<u8"), ("row", "<u4"), ("para", "<u4")])
GRID = 4096  # hash ranges every partition file is cut into; bucket tasks take runs of them


def paragraph_hashes(text: str) -> tuple[list[int], list[int]]:
    """(64-bit hashes, line numbers) of a text's non-blank lines."""
    hashes, lines = [], []
    for i, line in enumerate(text.split("\n")):
        line = line.strip()
        if line:
            hashes.append(xxhash.xxh3_64_intdigest(line.encode("utf-8", "surrogatepass")))
            lines.append(i)
    return hashes, lines


def grid_starts(cells: int = GRID) -> np.ndarray:
    """Where each of `cells` equal ranges of the 64-bit hash space begins."""
    return np.array([(i * 2**64) // cells for i in range(cells)], np.uint64)


def partition_entries(texts) -> tuple[dict, dict]:
    """Arrays of one partition from (row, key, text or None): its entries sorted by (hash, row, line),
    the bounds of the GRID ranges in them, and each row's key hash."""
    h, rows, paras, keys = [], [], [], []
    for row, key, text in texts:
        keys.append(key_hash(key))
        if text:
            hs, lines = paragraph_hashes(text)
            h += hs
            rows += [row] * len(hs)
            paras += lines
    entries = np.empty(len(h), ENTRY)
    entries["h"], entries["row"], entries["para"] = h, rows, paras
    entries = entries[np.lexsort((entries["para"], entries["row"], entries["h"]))]
    bounds = np.searchsorted(entries["h"], grid_starts(), side="left").astype(np.int64)
    arrays = {"entries": entries, "bounds": np.append(bounds, len(entries)), "keys": np.asarray(keys, np.uint64)}
    return arrays, {"rows": len(keys), "paragraphs": len(entries)}


def later_copies(h: np.ndarray, gid: np.ndarray, para: np.ndarray) -> np.ndarray:
    """Positions of every copy but the first (smallest document id, then line) of each paragraph."""
    order = np.lexsort((para, gid, h))
    hs = h[order]
    repeat = np.zeros(len(hs), bool)
    repeat[1:] = hs[1:] == hs[:-1]
    return order[repeat]


def cells_per_task(counts: np.ndarray, per_task: int) -> list[tuple[int, int]]:
    """Runs of grid cells [a, b) holding about `per_task` entries each (at least one cell each)."""
    out, start, acc = [], 0, 0
    for i, c in enumerate(counts.tolist()):
        if i > start and acc + c > per_task:
            out.append((start, i))
            start, acc = i, 0
        acc += c
    out.append((start, len(counts)))
    return out


def drop_lines(text: str, lines) -> str:
    """The text without the given line numbers."""
    gone = set(lines)
    return "\n".join(line for i, line in enumerate(text.split("\n")) if i not in gone)
