"""bench.json (the record), bench.md (the table) and the summary figures: medians with min-max, ratios, best."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict

from shardkit.loaderbench.settings import BenchConfig
from shardkit.loaderbench.data import BenchData
from shardkit.loaderbench.loaders import ALL_VARIANTS, MIXTURE_VARIANTS
from shardkit.store.local import atomic_write
from shardkit.meter import advice, band, mixture_line

SCHEMA = "shardkit.loaderbench/1"
METRICS = ("samples_per_s", "mb_per_s", "starved_pct", "first_batch_s", "peak_rss_bytes", "wait_p50_ms", "wait_p95_ms",
           "step_p50_ms", "epoch_start_wait_pct", "steady_wait_p95_ms", "steady_starved_pct")
ADVICE_FIGURES = ("starved_pct", "wait_p50_ms", "wait_p95_ms", "step_p50_ms", "epoch_start_wait_pct",
                  "steady_wait_p95_ms", "steady_starved_pct")
BASELINES = {"vs_raw_folder": "raw-folder", "vs_webdataset": "webdataset-tar"}


def label_checksum(counts) -> str:
    """Order-free fingerprint of the labels read: workers interleave batches differently per variant."""
    return hashlib.sha256(",".join(str(int(c)) for c in counts).encode()).hexdigest()[:16]


def expected_checksum(data: BenchData) -> str:
    counts = [0] * (len(data.classes) + 1)
    for _, label in data.items:
        counts[label if label >= 0 else -1] += 1
    return label_checksum(counts)


def machine() -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "gpu": gpu}


def cells(runs: list[dict]) -> list[dict]:
    """One entry per (variant, workers): median, min and max of each metric over the repetitions."""
    grouped: dict[tuple, list[dict]] = {}
    for r in runs:
        grouped.setdefault((r["variant"], r["workers"]), []).append(r)
    out = []
    for (variant, workers), rs in grouped.items():
        cell = {"variant": variant, "workers": workers, "repetitions": len(rs)}
        for m in METRICS:
            values = [r[m] for r in rs]
            cell[m] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        # The meter's band and advice for the median figures, so they agree with the starved% shown.
        pct = cell["starved_pct"]["median"]
        cell["band"] = band(pct)
        figures = {m: cell[m]["median"] for m in ADVICE_FIGURES}
        figures["steps"] = min(r["measured_steps"] for r in rs)
        cell["advice"] = advice(figures, num_workers=workers, data=ALL_VARIANTS[variant].data)
        if "mixture" in rs[0]:  # the same plan every repetition: the first run's shares stand for all
            cell["mixture"] = rs[0]["mixture"]
        out.append(cell)
    order = {name: i for i, name in enumerate(ALL_VARIANTS)}
    return sorted(out, key=lambda c: (order[c["variant"]], c["workers"]))


def ratios(table: list[dict]) -> dict:
    """Median samples/s of each cell over the baseline's at the same worker count (None without one)."""
    speed = {(c["variant"], c["workers"]): c["samples_per_s"]["median"] for c in table}
    out = {}
    for key, base in BASELINES.items():
        out[key] = {}
        for (variant, workers), v in speed.items():
            b = speed.get((base, workers))
            out[key].setdefault(variant, {})[str(workers)] = v / b if b else None
    return out


def best_of(table: list[dict]) -> dict:
    """The fastest cell, with its speed over the best setting of each baseline (None without one)."""
    best = max(table, key=lambda c: c["samples_per_s"]["median"])
    out = {"variant": best["variant"], "workers": best["workers"], "samples_per_s": best["samples_per_s"]["median"],
           "starved_pct": best["starved_pct"]["median"], "band": best["band"], "advice": best["advice"]}
    for key, base in BASELINES.items():
        speeds = [c["samples_per_s"]["median"] for c in table if c["variant"] == base]
        out[key] = out["samples_per_s"] / max(speeds) if speeds and max(speeds) > 0 else None
    return out


def checks(runs: list[dict], data: BenchData) -> dict:
    """Every run read every sample once: the count and the label checksum match the sample list. A
    mixture draws its own sample set: its count must match, and each source's observed share its target."""
    want = expected_checksum(data)
    bad = [f"{r['variant']} workers={r['workers']} rep {r['repetition']}: {r['samples']} samples, "
           f"checksum {r['label_checksum']}" for r in runs
           if r["samples"] != data.samples or (r["label_checksum"] != want and r["variant"] not in MIXTURE_VARIANTS)]
    bad += [f"{r['variant']} workers={r['workers']} rep {r['repetition']}: {mixture_line(r.get('mixture') or {})}"
            for r in runs if r["variant"] in MIXTURE_VARIANTS and not _on_target(r.get("mixture"))]
    return {"same_samples": not bad, "samples": data.samples, "label_checksum": want, "mismatches": bad}


def _on_target(shares: dict | None) -> bool:
    """Every source's observed share equals the share its plan put in the batches read."""
    return bool(shares) and all(v["observed"] is not None and abs(v["observed"] - v["target"]) < 1e-9
                                for v in shares.values())


def build_report(cfg: BenchConfig, data: BenchData, runs: list[dict], step: dict) -> dict:
    table = cells(runs)
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()},
        "step": step,
        "data": {"raw_folder": data.raw_folder, "samples": data.samples, "classes": len(data.classes),
                 "epochs_per_run": cfg.epochs_per_run(data.samples),
                 "image_size": data.image_size, "bytes": data.bytes, "jpeg_root": data.jpeg_root,
                 "raw_root": data.raw_root, "reused_shards": data.reused_shards},
        "variants": {name: ALL_VARIANTS[name].what for name in cfg.variants},
        "checks": checks(runs, data),
        "cells": table,
        "ratios": ratios(table),
        "best": best_of(table),
        "runs": runs,
    }


def _ratio(report: dict, key: str, cell: dict) -> str:
    value = report["ratios"][key].get(cell["variant"], {}).get(str(cell["workers"]))
    return "-" if value is None else f"{value:.1f}×"


def _epochs_line(report: dict) -> list[str]:
    """Why a run read several epochs (a small folder), or nothing when one was enough."""
    d, cfg = report["data"], report["config"]
    epochs = d.get("epochs_per_run", 1)
    if epochs <= 1:
        return []
    batches = -(-d["samples"] // cfg["batch_size"])
    return [f"{d['samples']} images make {batches} batch{'es' if batches != 1 else ''} of {cfg['batch_size']} per "
            f"epoch: each run read {epochs} epochs, so that at least {cfg['min_batches']} batches were measured "
            f"after the {cfg['warmup']} warm-up ones (--min-batches, --warmup)"]


def markdown(report: dict) -> str:
    """The table users read: medians with min-max over the interleaved repetitions."""
    d, cfg, step = report["data"], report["config"], report["step"]
    how = (f"simulated step {step['step_ms']:g} ms" if step["kind"] == "simulated"
           else f"{step['kind']} step, {step['precision']} on {step['device']}")
    lines = [f"{d['samples']} images ({d['classes']} classes) at {d['image_size']}², batch {cfg['batch_size']}, "
             f"{how}, {cfg['repeat']} interleaved repetitions, {cfg['warmup']} warm-up batches left out; "
             f"{report['machine']['cpus']} CPUs",
             *_epochs_line(report),
             "",
             "| variant | workers | samples/s median (min–max) | MB/s | starved % | first batch s | peak RSS MB "
             "| × raw folder | × WebDataset |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in report["cells"]:
        sps = c["samples_per_s"]
        lines.append(
            f"| {c['variant']} | {c['workers']} | {sps['median']:,.0f} ({sps['min']:,.0f}–{sps['max']:,.0f}) "
            f"| {c['mb_per_s']['median']:.1f} | {c['starved_pct']['median']:.1f} | {c['first_batch_s']['median']:.2f} "
            f"| {c['peak_rss_bytes']['median'] / 1e6:,.0f} | {_ratio(report, 'vs_raw_folder', c)} "
            f"| {_ratio(report, 'vs_webdataset', c)} |")
    mixed = [f"{c['variant']} workers={c['workers']}: {mixture_line(c['mixture'])}"
             for c in report["cells"] if c.get("mixture")]
    lines += ["", *mixed] if mixed else []
    b, chk = report["best"], report["checks"]
    versus = [f"{b[k]:.1f}× the {name}'s best" for k, name in (("vs_raw_folder", "raw folder"),
                                                                ("vs_webdataset", "WebDataset"))
              if b.get(k) is not None]
    lines += ["",
              f"best here: {b['variant']} with {b['workers']} workers, {b['samples_per_s']:,.0f} samples/s"
              + (f" ({', '.join(versus)})" if versus else "") + f", starved {b['starved_pct']:.1f}% ({b['band']})",
              f"measured {b['variant']} by workers: " + " · ".join(
                  f"{c['workers']}: {c['samples_per_s']['median']:,.0f}/s" for c in report["cells"]
                  if c["variant"] == b["variant"]),
              f"meter advice: {b['advice']}",
              (f"same samples in every run: {chk['samples']} samples, label checksum {chk['label_checksum']}"
               + (" (a mixture: its own samples, at its target proportions)"
                  if any(c["variant"] in MIXTURE_VARIANTS for c in report["cells"]) else "")
               if chk["same_samples"] else f"RUNS READ DIFFERENT SAMPLES: {'; '.join(chk['mismatches'])}")]
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, out: str) -> dict:
    """bench.json first (the plot is drawn from it), then bench.md; returns the paths."""
    paths = {"json": os.path.join(out, "bench.json"), "markdown": os.path.join(out, "bench.md")}
    atomic_write(paths["json"], json.dumps(report, indent=1, sort_keys=True) + "\n")
    atomic_write(paths["markdown"], markdown(report))
    return paths
