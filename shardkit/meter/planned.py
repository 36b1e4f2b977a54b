"""The feed-rate contract: a run's measured stage costs against `shardkit plan`'s (plan.json).

StarvationMeter(plan="plan.json") turns the stage spans on (a trace without a file unless trace=
is given too) and its summary compares, per sample, what the workers spent reading and decoding
with what the probe measured, and the loader's rate with the rate planned for this many workers.
"""

from __future__ import annotations

import json

from shardkit.errors import ConfigError

SLOWER = 1.3  # measured / planned per-sample time from which a stage is said to fall short
CORES_TAKEN = 0.8  # workers' CPU per worker below this while they fall short: other processes take the cores


def load_plan(path: str) -> dict:
    """plan.json as `shardkit plan` wrote it; a clear error otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"plan={path!r}: no such file; write one with `shardkit plan DATASET --rate N --out DIR` "
                          "(DIR/plan.json)") from None
    except ValueError as e:
        raise ConfigError(f"plan={path!r}: not JSON ({e}); give the plan.json `shardkit plan` wrote") from None
    if not isinstance(plan, dict) or "probe" not in plan or "curves" not in plan:
        raise ConfigError(f"plan={path!r}: not a plan written by `shardkit plan` (no 'probe' or 'curves')")
    return plan


def planned_rate(plan: dict, workers: int | None) -> float | None:
    curve = plan["curves"].get("as stored") or []
    w = plan.get("workers") if workers is None else workers
    return next((r for k, r in curve if k == w), None)


def compare(plan: dict, stages: dict, batches_spans, summary: dict, price: float | None) -> dict:
    """{rate, planned_rate, stages: {stage: {measured_ms, planned_ms, ratio}}, line}."""
    samples = sum(b["args"].get("samples") or 0 for b in batches_spans)
    probe = plan["probe"]
    planned = {"read": sum(f["read_s"] for f in probe["fields"].values()),
               "decode": sum(f["decode_s"] for f in probe["fields"].values())}
    spent: dict = {}
    for b in batches_spans:
        for name, start, end in b["stages"]:
            key = "read" if name in ("read", "fetch") else name
            spent[key] = spent.get(key, 0) + (end - start) / 1e9
    out = {"stages": {}, "planned_rate": planned_rate(plan, summary.get("num_workers")),
           "rate": summary.get("samples_per_s")}
    for name, want in planned.items():
        if samples and want > 0 and name in spent:
            got = spent[name] / samples
            out["stages"][name] = {"measured_ms": 1e3 * got, "planned_ms": 1e3 * want, "ratio": got / want}
    out["line"] = _line(out, summary, price)
    return out


def _line(cmp: dict, summary: dict, price: float | None) -> str:
    worst = max(cmp["stages"].items(), key=lambda kv: kv[1]["ratio"], default=None)
    rate, want = cmp["rate"], cmp["planned_rate"]
    head = f"plan: {want:,.0f} samples/s planned, {rate:,.0f} measured" if want and rate is not None else "plan:"
    if worst is None or worst[1]["ratio"] < SLOWER:
        return head + "; every stage within its planned cost"
    name, s = worst
    workers, cores = summary.get("num_workers") or 0, summary.get("worker_cpu_cores")
    if workers and cores is not None and cores / workers < CORES_TAKEN:
        why = (f"the workers got {cores / workers:.0%} of a core each: other processes take the cores")
    else:
        why = "the samples cost more than the probe's (other images, or another machine than the plan's)"
    line = f"{head}; {name} is {s['ratio']:.1f}x slower than planned ({s['measured_ms']:.2f} vs {s['planned_ms']:.2f} ms a sample): {why}"
    if price is not None and want and rate and rate < want:
        lost = summary.get("starved_pct", 0.0) / 100.0
        line += f"; the waiting costs ${price * lost:.2f} of every GPU-hour (at ${price:.2f} an hour)"
    return line
