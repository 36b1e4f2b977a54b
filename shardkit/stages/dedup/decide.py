"""From the partition files alone to the dedup decision: exact groups, LSH / image bands, clusters, report."""

from __future__ import annotations

import json

import numpy as np

from shardkit.config import DedupConfig
from shardkit.errors import Rejection, count_by_reason
from shardkit.stages.dedup import signatures as sigmod
from shardkit.stages.dedup.cluster import image_clusters, text_clusters
from shardkit.stages.dedup.image import band_masks
from shardkit.stages.dedup.lsh import detection_curve, detection_probability, optimal_params
from shardkit.stages.dedup.report import DedupResult, Removal, cluster_rows, number_clusters, write_report


def load_partitions(paths: list[str]) -> tuple[dict, list[Rejection]]:
    """All partition files merged in order (rows of each modality stay aligned with their keys)."""
    arrays, rejections = [], []
    for path in paths:
        a, r = sigmod.load(path)
        arrays.append(a)
        rejections += r
    if not arrays:
        arrays.append(sigmod.compute([], sigmod.SignatureParams())[0])
    cat = {k: np.concatenate([a[k] for a in arrays]) for k in
           ("keys", "modality", "digests", "shingle_counts", "signatures", "image_hashes", "rejected_keys")}
    cat["keys"] = cat["keys"].astype(str)
    cat["utf8_replaced"] = sum(json.loads(str(a["stats"]))["utf8_replaced"] for a in arrays)
    if "set_values" in arrays[0]:
        cat["sets"] = [a["set_values"][lo:hi] for a in arrays
                       for lo, hi in zip(a["set_offsets"][:-1].tolist(), a["set_offsets"][1:].tolist())]
    return cat, sorted(rejections, key=lambda r: (r.path, r.stage, r.reason))


def _lsh_params(cfg: DedupConfig) -> tuple[int, int]:
    return (cfg.bands, cfg.rows) if cfg.bands else optimal_params(cfg.threshold, cfg.num_perm)


def _text(data: dict, cfg: DedupConfig) -> tuple[list[dict], dict]:
    rows_of = np.flatnonzero(data["modality"] == sigmod.MODALITY_CODES["text"])
    order = np.argsort(data["keys"][rows_of], kind="stable")  # sort by key: the keep rule needs it
    keys = data["keys"][rows_of][order]
    sets = [data["sets"][i] for i in order.tolist()] if cfg.verify else None
    empty = data["shingle_counts"][order] == 0
    bands, rows = _lsh_params(cfg)
    signatures = data.pop("signatures")[order]  # the unordered copy is freed here: peak 2x, not 3x
    c = text_clusters(data["digests"][rows_of][order], signatures, empty,
                      threshold=cfg.threshold, bands=bands, rows=rows, sets=sets)
    stats = {"documents": int(len(keys)), "empty": int(empty.sum()), "utf8_replaced": data["utf8_replaced"],
             "bands": bands, "rows": rows,
             "detection_at_threshold": round(float(detection_probability(cfg.threshold, bands, rows)), 4),
             "detection_curve": detection_curve(bands, rows), "verify": cfg.verify,
             "bytes_per_signature": int(signatures.itemsize * cfg.num_perm), **c.stats}
    return cluster_rows(keys.tolist(), c, "text"), stats


def _image(data: dict, cfg: DedupConfig) -> tuple[list[dict], dict]:
    rows_of = np.flatnonzero(data["modality"] == sigmod.MODALITY_CODES["image"])
    order = np.argsort(data["keys"][rows_of], kind="stable")
    keys = data["keys"][rows_of][order]
    c = image_clusters(data["digests"][rows_of][order], data["image_hashes"][order], distance=cfg.image_distance)
    stats = {"images": int(len(keys)), "hash": cfg.image_hash, "distance": cfg.image_distance,
             "bands": len(band_masks(cfg.image_distance)), **c.stats}
    return cluster_rows(keys.tolist(), c, "image"), stats


def cluster_stage(paths: list[str], cfg: DedupConfig, report_dir: str | None,
                  extra_rejections: list[Rejection] = ()) -> DedupResult:
    """Stage 2, from the partition files alone: exact groups, LSH / image bands, clusters, report."""
    data, rejections = load_partitions(paths)
    rejections = sorted(list(extra_rejections) + rejections, key=lambda r: (r.path, r.stage, r.reason))
    keys = data["keys"]
    if len(np.unique(keys)) != len(keys):
        dup = next(k for k, n in zip(*np.unique(keys, return_counts=True)) if n > 1)
        raise ValueError(f"sample key {dup!r} occurs more than once in the dedup input; keys must be unique "
                         "(build the dataset with `shardkit build`, which makes them unique)")
    rows, summary = [], {}
    for name, fn in (("text", _text), ("image", _image)):
        if np.any(data["modality"] == sigmod.MODALITY_CODES[name]):
            more, summary[name] = fn(data, cfg)
            rows += more
    rows = number_clusters(rows)
    removed = [Removal(r["key"], r["duplicate_of"], r["similarity"], r["reason"], r["modality"])
               for r in rows if not r["kept"]]
    inputs = len(keys) + len(rejections)
    summary.update({
        "inputs": inputs, "considered": int(np.count_nonzero(data["modality"])),
        "no_content": int(np.count_nonzero(data["modality"] == 0)),
        "exact_duplicates": sum(r.reason == "exact" for r in removed),
        "near_duplicates": sum(r.reason == "near" for r in removed),
        "removed": len(removed), "kept": len(keys) - len(removed), "clusters": len({r["cluster"] for r in rows}),
        "rejected": len(rejections), "rejected_by_reason": count_by_reason(rejections),
        "parameters": cfg.recorded()})
    if report_dir:
        write_report(report_dir, rows, summary)
    return DedupResult(inputs, removed, rows, summary, rejections, sorted(data["rejected_keys"].astype(str).tolist()))
