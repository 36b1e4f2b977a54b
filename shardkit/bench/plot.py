"""bench.png from bench.json: samples/s by variant x workers (log scale, min-max bars) and starved% bars."""

from __future__ import annotations

import json

from shardkit.errors import ShardkitError
from shardkit.fs import atomic_writer

INSTALL = "pip install 'shardkit[plot]'"


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise ShardkitError(f"the bench plot needs matplotlib, which is not installed: {INSTALL} "
                            "(bench.json and bench.md are written without it)") from e
    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    return plt


def _grouped(ax, cells, variants, workers, metric: str, errors: bool) -> None:
    width = 0.8 / len(workers)
    for j, w in enumerate(workers):
        xs, ys, lo, hi = [], [], [], []
        for i, v in enumerate(variants):
            c = cells.get((v, w))
            if c is None:
                continue
            m = c[metric]
            xs.append(i + (j - (len(workers) - 1) / 2) * width)
            ys.append(m["median"])
            lo.append(m["median"] - m["min"])
            hi.append(m["max"] - m["median"])
        ax.bar(xs, ys, width, label=f"{w} worker{'s' if w != 1 else ''}", yerr=[lo, hi] if errors else None, capsize=2)
    ax.set_xticks(range(len(variants)), variants, rotation=20, ha="right")


def plot_file(json_path: str, png_path: str) -> str:
    """Draw the bench plot from a bench.json into png_path; returns png_path."""
    plt = _pyplot()
    with open(json_path, encoding="utf-8") as f:
        report = json.load(f)
    cells = {(c["variant"], c["workers"]): c for c in report["cells"]}
    variants = list(dict.fromkeys(c["variant"] for c in report["cells"]))
    workers = sorted({c["workers"] for c in report["cells"]})
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    _grouped(left, cells, variants, workers, "samples_per_s", errors=True)
    left.set_yscale("log")
    # 2,000 rather than 2×10³; minor labels only at 2 and 5 so they do not overlap.
    left.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    left.yaxis.set_minor_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.0f}" if f"{v:.0e}"[0] in "25" else ""))
    left.set_ylabel("samples/s (median, min–max; log scale)")
    left.set_title("loader throughput")
    left.legend()
    _grouped(right, cells, variants, workers, "starved_pct", errors=False)
    right.set_ylim(0, 100)
    right.set_ylabel("starved % (time waiting for data)")
    step = report["step"]
    if step["kind"] != "simulated":
        title = f"starved % with the {step['kind']} step on {step['device']}"
    elif step["step_ms"]:
        title = f"starved % with a {step['step_ms']:g} ms simulated step"
    else:  # no step: all time is loading, so ~100% says nothing; --step-ms makes this panel useful
        title = "starved % with no step (pure loader speed; try --step-ms 20)"
    right.set_title(title)
    for y in (5, 20):  # the TensorFlow profiler's bands: fine / moderately / input-bound
        right.axhline(y, color="grey", linestyle="--", linewidth=0.8)
    d = report["data"]
    fig.suptitle(f"shardkit bench: {d['samples']} images at {d['image_size']}², batch {report['config']['batch_size']}, "
                 f"{report['machine']['cpus']} CPUs")
    fig.tight_layout()
    with atomic_writer(png_path) as f:  # a killed run leaves the old plot, never half a PNG
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return png_path
