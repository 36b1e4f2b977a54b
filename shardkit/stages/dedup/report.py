"""The reviewable record of a dedup run: clusters.parquet (one row per clustered sample) + summary.json."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from shardkit.errors import Rejection
from shardkit.fs import atomic_write, atomic_writer

CLUSTERS_NAME = "clusters.parquet"
SUMMARY_NAME = "summary.json"


@dataclass(frozen=True, slots=True)
class Removal:
    """One removed sample: the key it duplicates (the kept one), how similar, and why."""

    key: str
    duplicate_of: str
    similarity: float
    reason: str  # "exact" or "near"
    modality: str  # "text" or "image"


@dataclass
class DedupResult:
    """What a dedup run decided; `summary` is what summary.json holds."""

    inputs: int
    removed: list[Removal]
    rows: list[dict]  # clusters.parquet rows
    summary: dict
    rejections: list[Rejection] = field(default_factory=list)
    rejected_keys: list[str] = field(default_factory=list)  # samples dropped as unreadable

    @property
    def removed_keys(self) -> set[str]:
        return {r.key for r in self.removed}

    @property
    def kept(self) -> int:
        return self.summary["kept"]


def cluster_rows(keys: list[str], clusters, modality: str) -> list[dict]:
    """Rows for every sample in a cluster of two or more (kept first); cluster ids come later."""
    import numpy as np

    label = clusters.label
    in_cluster = np.zeros(len(keys), bool)
    in_cluster[clusters.removed] = True
    in_cluster[label[clusters.removed]] = True
    rows = []
    for i in np.flatnonzero(in_cluster).tolist():
        kept = int(label[i]) == i
        rows.append({"key": keys[i], "kept": kept, "duplicate_of": None if kept else keys[label[i]],
                     "similarity": round(float(clusters.similarity[i]), 6),
                     "reason": None if kept else ("exact" if clusters.exact[i] else "near"),
                     "modality": modality, "_kept_key": keys[label[i]]})
    return rows


def number_clusters(rows: list[dict]) -> list[dict]:
    """Cluster ids 0.. in order of the kept key, rows sorted (cluster, kept first, key): deterministic."""
    ids = {k: i for i, k in enumerate(sorted({r["_kept_key"] for r in rows}))}
    out = [{"cluster": ids[r["_kept_key"]], **{k: v for k, v in r.items() if k != "_kept_key"}} for r in rows]
    out.sort(key=lambda r: (r["cluster"], not r["kept"], r["key"]))
    return out


def write_report(folder: str, rows: list[dict], summary: dict) -> None:
    """FOLDER/clusters.parquet and FOLDER/summary.json, each written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("cluster", pa.int64()), ("key", pa.string()), ("kept", pa.bool_()),
                        ("duplicate_of", pa.string()), ("similarity", pa.float64()),
                        ("reason", pa.string()), ("modality", pa.string())])
    table = pa.Table.from_pylist(rows, schema=schema)
    os.makedirs(folder, exist_ok=True)
    with atomic_writer(os.path.join(folder, CLUSTERS_NAME)) as f:
        pq.write_table(table, f, compression="zstd")
    atomic_write(os.path.join(folder, SUMMARY_NAME), json.dumps(summary, indent=1, sort_keys=True) + "\n")


def summary_text(result: DedupResult) -> str:
    """The one-screen summary the CLI prints."""
    s = result.summary
    lines = [f"dedup: {s['inputs']} inputs → {s['kept']} kept, {s['removed']} removed "
             f"({s['exact_duplicates']} exact, {s['near_duplicates']} near) in {s['clusters']} clusters"]
    if "text" in s:
        t = s["text"]
        lines.append(f"  text:  {t['documents']} docs, {t['empty']} empty, {t['utf8_replaced']} bad UTF-8 bytes "
                     f"replaced; LSH {t['bands']} bands x {t['rows']} rows, P(found | J={s['parameters']['threshold']}) "
                     f"= {t['detection_at_threshold']:.2f}; {t['candidate_pairs']} candidate pairs, "
                     f"{t['rejected_pairs']} under the threshold")
    if "image" in s:
        m = s["image"]
        lines.append(f"  image: {m['images']} images, {m['hash']} within {m['distance']} bits via {m['bands']} bands")
    if s.get("rejected"):
        lines.append(f"  rejected: {s['rejected']} ({', '.join(f'{k}: {v}' for k, v in s['rejected_by_reason'].items())})")
    return "\n".join(lines)
