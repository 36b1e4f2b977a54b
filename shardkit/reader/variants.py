"""Offline-augmented datasets on the read side: which stored variant each sample shows this epoch."""

from __future__ import annotations

import hashlib

import numpy as np

from shardkit.config import VARIANT_POLICIES as POLICIES
from shardkit.errors import ConfigError
from shardkit.contract import key_hash


def choose(keys: list[str], epoch: int, k: int, policy: str = "cycle", seed: int = 0) -> np.ndarray:
    """The variant index of each key in `epoch`.

    cycle: (epoch + h(key)) mod K, so consecutive epochs show different variants and every variant
    is shown once per key over any K consecutive epochs. random: a seeded draw per (seed, epoch, key).
    """
    if policy not in POLICIES:
        raise ConfigError(f"variant policy {policy!r}; choose one of {', '.join(POLICIES)}")
    h = np.array([key_hash(key) for key in keys], dtype=np.uint64)
    if policy == "cycle":
        return ((h % np.uint64(k) + np.uint64(epoch % k)) % np.uint64(k)).astype(np.int64)
    mixed = [hashlib.blake2b(f"{seed}|{epoch}|{x}".encode(), digest_size=8).digest() for x in h.tolist()]
    return np.array([int.from_bytes(m, "little") % k for m in mixed], dtype=np.int64)


def variant_map(fields: dict, name: str) -> list[str]:
    """Field names of variants 0..K-1 of `name`, from the manifest's field specs."""
    k = int(fields[name]["variants"])
    names = [name] + [None] * (k - 1)
    for other, spec in fields.items():
        if spec.get("variant_of") == name:
            names[int(spec["variant"])] = other
    missing = [i for i, n in enumerate(names) if n is None]
    if missing:
        raise ConfigError(f"the manifest declares {k} variants of {name!r} but lacks variants {missing}; rebuild "
                          "the dataset")
    return names


class VariantReader:
    """Wraps a shard reader so that reading field `name` reads each row's chosen variant instead.

    Only the chosen variant's bytes are read and decoded: the cost per epoch stays one image.
    """

    def __init__(self, reader, fields: dict, name: str, epoch: int, policy: str = "cycle", seed: int = 0):
        self.reader, self.names = reader, variant_map(fields, name)
        self.epoch, self.policy, self.seed = epoch, policy, seed

    def has(self, field: str) -> bool:
        return self.reader.has(field)

    def _split(self, rows):
        rows = np.asarray(rows, np.int64)
        keys = self.reader.keys
        chosen = choose([keys[r] for r in rows.tolist()], self.epoch, len(self.names), self.policy, self.seed)
        for v in np.unique(chosen).tolist():
            sel = np.nonzero(chosen == v)[0]
            yield self.names[v], sel, rows[sel]

    def values(self, field: str, rows) -> list:
        out: list = [None] * len(rows)
        for name, sel, sub in self._split(rows):
            for j, value in zip(sel.tolist(), self.reader.values(name, sub)):
                out[j] = value
        return out

    def fill(self, field: str, rows, out: np.ndarray, positions) -> np.ndarray:
        positions = np.asarray(positions)
        present = np.zeros(len(rows), bool)
        for name, sel, sub in self._split(rows):
            present[sel] = self.reader.fill(name, sub, out, positions[sel])
        return present


def wrap_groups(groups: list, fields: dict, name: str, epoch: int, policy: str = "cycle", seed: int = 0) -> list:
    """StreamingDataset's (shard, reader, positions, rows) groups with readers picking variants."""
    return [(s, VariantReader(reader, fields, name, epoch, policy, seed), pos, r) for s, reader, pos, r in groups]
