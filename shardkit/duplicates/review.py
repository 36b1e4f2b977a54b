"""The reviewable record of a dedup run: clusters.parquet (one row per clustered sample) + summary.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from shardkit.errors import Rejection
from shardkit.duplicates.phash import hamming
from shardkit.duplicates.partitions import PartitionSet
from shardkit.duplicates.signatures import MODALITY_NAMES

CLUSTERS_NAME = "clusters.parquet"
SUMMARY_NAME = "summary.json"
KEEP_RULES = {True: "kept: smallest key", False: "kept: first in input order"}
ROW_CHUNK = 65_536  # clustered rows gathered at once from the partition files


def clusters_schema():
    import pyarrow as pa

    return pa.schema([("cluster", pa.int64()), ("key", pa.string()), ("kept", pa.bool_()),
                      ("duplicate_of", pa.string()), ("similarity", pa.float64()), ("reason", pa.string()),
                      ("modality", pa.string()), ("source", pa.string()), ("source_row", pa.int64()),
                      ("duplicate_of_source", pa.string()), ("duplicate_of_source_row", pa.int64())])


@dataclass
class DedupResult:
    """What a dedup run decided. Ids are positions in the input order (row of the partition files)."""

    summary: dict
    clusters: object  # pyarrow Table: what clusters.parquet holds
    removed_ids: np.ndarray  # duplicates removed
    rejected_ids: np.ndarray  # inputs dedup could not read (images it could not decode, …)
    rejections: list[Rejection] = field(default_factory=list)

    @property
    def removed_keys(self) -> set[str]:
        kept = self.clusters.column("kept").to_pylist()
        return {k for k, keep in zip(self.clusters.column("key").to_pylist(), kept) if not keep}

    @property
    def rows(self) -> list[dict]:
        return self.clusters.to_pylist()

    @property
    def kept(self) -> int:
        return self.summary["kept"]


def _similarity(parts: PartitionSet, a: np.ndarray, b: np.ndarray, verify: bool) -> tuple[np.ndarray, np.ndarray]:
    """(similarity, exact) of each pair (a[i], b[i]) of clustered ids: 1.0 for identical content,
    else the MinHash estimate / exact Jaccard (text) or 1 - hamming/64 (images)."""
    da, db = parts.column("digests", a), parts.column("digests", b)
    exact = np.all(da == db, axis=1)
    sim = np.ones(len(a))
    kind = parts.column("kind", a)
    text = ~exact & (kind == 1)
    if text.any():
        if verify:
            from shardkit.duplicates.links import jaccard_exact

            sim[text] = jaccard_exact(parts.sets(a[text]), parts.sets(b[text]))
        else:
            sa, sb = parts.signatures(a[text]), parts.signatures(b[text])
            sim[text] = np.count_nonzero(sa == sb, axis=1) / sa.shape[1]
    image = ~exact & (kind == 2)
    if image.any():
        sim[image] = 1.0 - hamming(parts.column("image_hashes", a[image]), parts.column("image_hashes", b[image])) / 64.0
    return sim, exact


def cluster_table(parts: PartitionSet, nodes: np.ndarray, labels: np.ndarray, *, verify: bool, key_order: bool):
    """clusters.parquet rows for every clustered id, sorted (cluster, kept first, id)."""
    import pyarrow as pa

    order = np.lexsort((nodes, nodes != labels, labels))
    nodes, labels = nodes[order], labels[order]
    cluster = np.searchsorted(np.unique(labels), labels)
    pieces = []
    for lo in range(0, len(nodes), ROW_CHUNK):
        n, lab = nodes[lo:lo + ROW_CHUNK], labels[lo:lo + ROW_CHUNK]
        kept = n == lab
        sim, exact = _similarity(parts, n, lab, verify)
        src_rows, dup_rows = parts.column("source_rows", n), parts.column("source_rows", lab)
        reason = np.where(kept, KEEP_RULES[key_order], np.where(exact, "exact", "near"))
        dup_keys = parts.strings("keys", lab)
        dup_sources = parts.strings("sources", lab)
        pieces.append(pa.table({
            "cluster": pa.array(cluster[lo:lo + ROW_CHUNK], pa.int64()),
            "key": pa.array(parts.strings("keys", n), pa.string()),
            "kept": pa.array(kept),
            "duplicate_of": pa.array([None if k else d for k, d in zip(kept.tolist(), dup_keys)], pa.string()),
            "similarity": pa.array(np.round(sim, 6), pa.float64(), mask=kept),
            "reason": pa.array(reason.tolist(), pa.string()),
            "modality": pa.array([MODALITY_NAMES[int(m)] for m in parts.column("kind", n)], pa.string()),
            "source": pa.array(parts.strings("sources", n), pa.string()),
            "source_row": pa.array(src_rows, pa.int64(), mask=src_rows < 0),
            "duplicate_of_source": pa.array([None if k else d for k, d in zip(kept.tolist(), dup_sources)],
                                            pa.string()),
            "duplicate_of_source_row": pa.array(dup_rows, pa.int64(), mask=kept | (dup_rows < 0)),
        }, schema=clusters_schema()))
    return pa.concat_tables(pieces) if pieces else clusters_schema().empty_table()


def dedup_record(summary: dict, samples: int) -> dict:
    """What a dataset's manifest records of the dedup that produced it (`build.dedup`): the
    parameters, the duplicates removed, and `source_samples`, what the dataset would hold without
    them (its `samples` + removed)."""
    return {"config": summary["parameters"], "source_samples": samples + summary["removed"],
            "removed": summary["removed"], "report": "dedup/summary.json"}


def write_report(folder: str, result: DedupResult, policy=None) -> None:
    """FOLDER/clusters.parquet and FOLDER/summary.json, each written atomically, once per run (`policy`:
    the job's RemotePolicy, for a folder on a store)."""
    import pyarrow.parquet as pq

    import shardkit.store as store

    store.makedirs(folder)
    with store.writer(store.join(folder, CLUSTERS_NAME), policy=policy) as f:  # a local folder or a store
        pq.write_table(result.clusters, f, compression="zstd")
    store.write(store.join(folder, SUMMARY_NAME), json.dumps(result.summary, indent=1, sort_keys=True) + "\n",
                policy)


def summary_text(result: DedupResult) -> str:
    """The one-screen summary the CLI prints."""
    s = result.summary
    lines = [f"dedup: {s['inputs']} inputs → {s['kept']} kept, {s['removed']} removed "
             f"({s['exact_duplicates']} exact, {s['near_duplicates']} near) in {s['clusters']} clusters"]
    if s.get("text", {}).get("documents"):
        t, p = s["text"], s["parameters"]
        lines.append(f"  text:  {t['documents']} docs ({t['compared']} compared by MinHash, {t['too_few_shingles']} "
                     f"too short: exact only, {t['empty']} empty); LSH {p['bands']} bands x {p['rows']} rows "
                     f"({t['permutations_used']} of {p['num_perm']} permutations), P(found | J={p['threshold']}) "
                     f"= {t['detection_at_threshold']:.2f}; {t['candidate_pairs']} candidate pairs, "
                     f"{t['rejected_pairs']} under the threshold")
    if s.get("image", {}).get("images"):
        m = s["image"]
        lines.append(f"  image: {m['images']} images, {m['hash']} within {m['distance']} bits via {m['bands']} bands")
    if s.get("rejected"):
        lines.append(f"  rejected: {s['rejected']} ({', '.join(f'{k}: {v}' for k, v in s['rejected_by_reason'].items())})")
    ex = s.get("execution")
    if ex:
        lines.append(f"  ran {ex['mode']}" + (f" ({ex['workers']} workers)" if ex["mode"] != "in-process" else "")
                     + f": {ex['reason']}")
    return "\n".join(lines)


def in_key_order(metas: list[dict]) -> bool:
    """Whether the partitions' rows are in strictly increasing key order (then the first is the smallest)."""
    filled = [m for m in metas if m["stats"]["rows"]]
    return all(m["key_order"] for m in filled) and all(a["last_key"] < b["first_key"] for a, b in zip(filled, filled[1:]))


def _sum_stats(metas: list[dict]) -> dict:
    total: dict = {}
    for m in metas:
        for k, v in m["stats"].items():
            total[k] = total.get(k, 0) + v
    return total


def summarise(metas: list[dict], link_stats: dict, table, params: dict, rejections: list[Rejection]) -> dict:
    """summary.json from the partitions' counts, the links and the clusters table; every count
    agrees with the others: inputs = rejected + no field + text documents + images, and
    inputs = kept + removed + rejected."""
    from shardkit.errors import count_by_reason
    from shardkit.duplicates.phash import band_masks
    from shardkit.duplicates.lsh import detection_curve, detection_probability

    st = _sum_stats(metas)
    reasons = table.column("reason").to_pylist()
    removed = sum(r in ("exact", "near") for r in reasons)
    summary = {
        "inputs": st.get("rows", 0), "rejected": st.get("rejected", 0),
        "rejected_by_reason": count_by_reason(rejections),
        "no_content": st.get("none", 0) + st.get("empty", 0),
        "kept": st.get("rows", 0) - removed - st.get("rejected", 0), "removed": removed,
        "exact_duplicates": reasons.count("exact"), "near_duplicates": reasons.count("near"),
        "clusters": len(set(table.column("cluster").to_pylist())), "keep_rule": KEEP_RULES[in_key_order(metas)],
        "parameters": params,
    }
    bands, rows = params["bands"], params["rows"]
    if st.get("texts"):
        summary["text"] = {
            "documents": st["texts"], "compared": st["texts"] - st["empty"] - st["too_few_shingles"],
            "too_few_shingles": st["too_few_shingles"], "min_shingles": params["min_shingles"],
            "symbolic": st["symbolic"], "empty": st["empty"], "utf8_replaced": st["utf8_replaced"],
            "permutations_used": bands * rows, "bytes_per_signature": 4 * params["num_perm"],
            "detection_at_threshold": round(float(detection_probability(params["threshold"], bands, rows)), 4),
            "detection_curve": detection_curve(bands, rows),
            **{k: link_stats[k] for k in ("candidate_pairs", "linked_pairs", "rejected_pairs")}}
    if st.get("images"):
        summary["image"] = {"images": st["images"], "hash": params["image_hash"], "distance": params["image_distance"],
                            "bands": len(band_masks(params["image_distance"])), "exact": "identical bytes"}
    return summary
