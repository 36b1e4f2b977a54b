"""`shardkit plan`: before a run, will the loader feed the model on this machine, and what is the cheapest fix.

probe.py measures (≤ 30 s), model.py predicts samples/s per worker count and placement, draw.py
writes the PNG; `make_plan` ties them and `text` gives the one screen.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

from shardkit.errors import ConfigError

__all__ = ["PlanConfig", "make_plan", "text"]


@dataclass(frozen=True)
class PlanConfig:
    """`shardkit plan DATASET`: the target (a rate, or a step time and batch), what to read, where to write."""

    dataset: str
    rate: float | None = None
    step_ms: float | None = None
    batch: int = 64
    workers: int | None = None  # None: make_loader's default for this machine
    fields: tuple[str, ...] | None = None
    image_size: int | None = None  # a raw folder: the size its images would be resized to
    out: str = "plan"

    def __post_init__(self):
        if self.rate is None and self.step_ms is None:
            raise ConfigError("no target: give --rate SAMPLES_PER_S, or --step-ms MS with --batch B")
        if self.rate is not None and (not isinstance(self.rate, (int, float)) or self.rate <= 0):
            raise ConfigError(f"--rate {self.rate!r}: expected samples/s > 0")
        if self.step_ms is not None and (not isinstance(self.step_ms, (int, float)) or self.step_ms <= 0):
            raise ConfigError(f"--step-ms {self.step_ms!r}: expected milliseconds > 0")
        if not isinstance(self.batch, int) or self.batch <= 0:
            raise ConfigError(f"--batch {self.batch!r}: expected a positive batch size")
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"--workers {self.workers!r}: expected 0 or more")

    @property
    def target(self) -> float:
        """Samples/s the model takes: --rate, or --batch per --step-ms."""
        return float(self.rate) if self.rate is not None else self.batch / (self.step_ms / 1e3)


def _is_dataset(src: str) -> bool:
    from shardkit.store.local import is_url

    return is_url(src) or os.path.isfile(os.path.join(src, "manifest.json"))


def make_plan(cfg: PlanConfig) -> dict:
    """Probe, predict, choose; writes OUT/plan.json and OUT/plan.png and returns the plan."""
    from shardkit.store.local import is_url
    from shardkit.loader import default_workers
    from shardkit.plan import model, probe

    src = cfg.dataset
    if not is_url(src) and not os.path.isdir(src):
        raise ConfigError(f"{src}: no such dataset or folder (give a dataset built by `shardkit build`, "
                          "a raw folder of images, or an http(s):// or s3:// dataset)")
    if _is_dataset(src):
        _check_fields(src, cfg.fields)
        with tempfile.TemporaryDirectory(prefix="shardkit-plan-") as cache:
            p = probe.probe_dataset(src, list(cfg.fields) if cfg.fields else None, cfg.batch, cache)
    else:
        if cfg.fields:
            raise ConfigError(f"--fields {','.join(cfg.fields)}: a raw folder has no fields; drop --fields")
        p = probe.probe_folder(src, cfg.image_size)
        if not p.samples:
            raise ConfigError(f"{src}: no images (jpg, png, webp, bmp) and no manifest.json: nothing to plan")
    workers = default_workers(p.cores) if cfg.workers is None else cfg.workers
    target = cfg.target
    now = model.rate(p, workers)
    plan = {"dataset": src, "target_samples_per_s": target, "workers": workers, "probe": p.to_dict(),
            "predicted_samples_per_s": now, "feeds": now >= target,
            "cpu_share": min(1.0, target * (p.worker_s + p.main_s) / max(1, p.cores)),
            "curves": {k: [[w, r] for w, r in v] for k, v in model.curves(p).items()},
            "changes": [] if now >= target else model.changes(p, target, workers)}
    os.makedirs(cfg.out, exist_ok=True)
    from shardkit.store.local import atomic_write
    from shardkit.plan.draw import draw_plan

    atomic_write(os.path.join(cfg.out, "plan.json"), json.dumps(plan, indent=2, sort_keys=True) + "\n")
    draw_plan(plan, os.path.join(cfg.out, "plan.png"))
    plan["outputs"] = [os.path.join(cfg.out, "plan.json"), os.path.join(cfg.out, "plan.png")]
    return plan


def _check_fields(src: str, fields) -> None:
    if not fields:
        return
    from shardkit.manifest import load_manifest

    known = list(load_manifest(src).fields)
    bad = [f for f in fields if f not in known]
    if bad:
        raise ConfigError(f"--fields: unknown field {', '.join(map(repr, bad))}; {src} has {', '.join(known)}")


def text(plan: dict) -> str:
    """One screen: what was measured, the prediction, and the changes."""
    p = plan["probe"]
    lines = [f"{plan['dataset']}: {p['samples']} samples, {p['cores']} cores ({p['free_cores']:.1f} free now), "
             f"probed in {p['probe_s']:.1f} s"
             + (f"; store: round trip {1e3 * p['rtt_s']:.0f} ms, {p['conn_bytes_per_s'] / 1e6:.1f} MB/s a connection"
                if p["remote"] else "")]
    for name, f in p["fields"].items():
        lines.append(f"  {name:<10} read {1e3 * f['read_s']:.3f} ms  decode {1e3 * f['decode_s']:.3f} ms a sample"
                     f"  ({f.get('encoding') or f.get('kind')})")
    lines.append(f"  one worker: {1e3 * p['worker_s']:.3f} ms a sample (+{1e3 * p['main_s']:.3f} ms in the training process)")
    lines.append("predicted samples/s by workers:")
    for name, pts in plan["curves"].items():
        lines.append(f"  {name:<13} " + "  ".join(f"{w}:{r:,.0f}" for w, r in pts))
    verdict = "feeds" if plan["feeds"] else "does NOT feed"
    lines.append(f"target {plan['target_samples_per_s']:,.0f} samples/s: {plan['workers']} workers give "
                 f"{plan['predicted_samples_per_s']:,.0f}/s: the loader {verdict} it "
                 f"(using {100 * plan['cpu_share']:.0f}% of the CPU at the target)")
    for c in plan["changes"][:5]:
        lines.append(f"  {'->' if c['feeds'] else '  '} {c['change']}: {c['rate']:,.0f}/s; {c['cost']}"
                     + ("" if c["feeds"] else " (not enough)"))
    if not plan["feeds"] and not any(c["feeds"] for c in plan["changes"]):
        lines.append("  no single change feeds the target here: combine them, or add cores")
    return "\n".join(lines)
