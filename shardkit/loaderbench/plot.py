"""bench.png from bench.json: samples/s by variant x workers (log scale, min-max bars) and starved% bars.

Drawn with Pillow, a dependency already: the plot comes with the default install.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from shardkit.store.local import atomic_writer

SIZE = (1300, 500)
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
INK, GRID = (0, 0, 0), (150, 150, 150)
# Plot areas (left, top, right, bottom) of the two panels: room for the y label, ticks and the
# rotated variant names below.
PANELS = ((95, 60, 640, 410), (745, 60, 1285, 410))
BANDS = (5, 20)  # the TensorFlow profiler's bands: fine / moderately / input-bound


@dataclass(frozen=True)
class Bar:
    """One bar: the cell it shows, its rectangle in pixels and its min-max whisker (None: none)."""

    variant: str
    workers: int
    box: tuple[int, int, int, int]
    whisker: tuple[int, int] | None
    color: str


class Axis:
    """Value -> pixel row of a panel, linear or log10."""

    def __init__(self, lo: float, hi: float, top: int, bottom: int, log: bool):
        self.log, self.top, self.bottom = log, top, bottom
        self.lo, self.hi = (math.log10(lo), math.log10(hi)) if log else (lo, hi)

    def y(self, value: float) -> int:
        v = math.log10(max(value, 1e-9)) if self.log else value
        frac = (v - self.lo) / ((self.hi - self.lo) or 1.0)
        return round(self.bottom - min(max(frac, 0.0), 1.0) * (self.bottom - self.top))

    def ticks(self) -> list[tuple[float, str]]:
        if not self.log:
            step = 20 if self.hi - self.lo > 50 else 10
            return [(v, f"{v:g}") for v in range(int(self.lo), int(self.hi) + 1, step)]
        out = []
        for exp in range(math.floor(self.lo), math.ceil(self.hi) + 1):
            for mult in (1, 2, 5):  # 1, 2, 5 per decade, written out: 2,000 rather than 2×10³
                v = mult * 10.0 ** exp
                if self.lo - 1e-9 <= math.log10(v) <= self.hi + 1e-9:
                    out.append((v, f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        return out


def log_axis(cells: list[dict], top: int, bottom: int) -> Axis:
    """A log axis from a bit below the slowest min to a bit above the fastest max."""
    lows = [c["samples_per_s"]["min"] for c in cells if c["samples_per_s"]["min"] > 0] or [1.0]
    highs = [c["samples_per_s"]["max"] for c in cells] or [10.0]
    return Axis(min(lows) / 1.5, max(max(highs), min(lows) * 2) * 1.5, top, bottom, log=True)


def bars(cells: list[dict], metric: str, axis: Axis, panel: tuple, whiskers: bool) -> list[Bar]:
    """Grouped bars: one group per variant (in report order), one bar per worker count."""
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    workers = sorted({c["workers"] for c in cells})
    left, _, right, bottom = panel
    group = (right - left) / max(len(variants), 1)
    width = group * 0.8 / len(workers)
    out = []
    for c in cells:
        i, j = variants.index(c["variant"]), workers.index(c["workers"])
        x0 = round(left + group * (i + 0.1) + width * j)
        m = c[metric]
        box = (x0, axis.y(m["median"]), round(x0 + width) - 1, bottom)
        whisker = (axis.y(m["max"]), axis.y(m["min"])) if whiskers else None
        out.append(Bar(c["variant"], c["workers"], box, whisker, COLORS[j % len(COLORS)]))
    return out


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _text(img, xy, text: str, size: int = 13, anchor: str = "la", angle: float = 0) -> None:
    """Text at xy; rotated text is drawn on its own layer and pasted so that its anchor lands on xy.
    Pillow's built-in font covers ASCII: keep labels to it (no ², no en dash)."""
    from PIL import Image, ImageDraw

    font = _font(size)
    if not angle:
        ImageDraw.Draw(img).text(xy, text, fill=INK, font=font, anchor=anchor)
        return
    l, t, r, b = font.getbbox(text)
    layer = Image.new("L", (r + 2, b + 2))
    ImageDraw.Draw(layer).text((0, 0), text, fill=255, font=font)
    layer = layer.rotate(angle, expand=True, resample=Image.Resampling.BICUBIC)
    x, y = xy
    if angle == 90:  # a y label: centred on xy
        img.paste(INK, (round(x - layer.width / 2), round(y - layer.height / 2)), layer)
    else:  # a tick label slanting down-left from xy
        img.paste(INK, (round(x - layer.width), round(y)), layer)


def _panel(img, panel: tuple, axis: Axis, drawn: list[Bar], labels: dict) -> None:
    from PIL import ImageDraw

    draw = ImageDraw.Draw(img)
    left, top, right, bottom = panel
    for value, label in axis.ticks():
        y = axis.y(value)
        draw.line((left - 5, y, left, y), fill=INK)
        _text(img, (left - 8, y), label, 12, anchor="rm")
    for bar in drawn:
        draw.rectangle(bar.box, fill=bar.color)
        if bar.whisker is not None:
            cx = (bar.box[0] + bar.box[2]) // 2
            draw.line((cx, bar.whisker[0], cx, bar.whisker[1]), fill=INK)
            for y in bar.whisker:
                draw.line((cx - 3, y, cx + 3, y), fill=INK)
    for y in labels.get("bands", ()):
        for x in range(left, right, 8):  # dashed
            draw.line((x, axis.y(y), min(x + 4, right), axis.y(y)), fill=GRID)
    draw.rectangle(panel, outline=INK)
    variants = list(dict.fromkeys(b.variant for b in drawn))
    group = (right - left) / max(len(variants), 1)
    for i, name in enumerate(variants):
        _text(img, (left + group * (i + 0.5) + 6, bottom + 4), name, 13, angle=20)
    _text(img, ((left + right) / 2, top - 8), labels["title"], 15, anchor="md")
    _text(img, (left - 70, (top + bottom) / 2), labels["ylabel"], 13, angle=90)


def _legend(img, panel: tuple, workers: list[int]) -> None:
    from PIL import ImageDraw

    draw = ImageDraw.Draw(img)
    x, y = panel[0] + 10, panel[1] + 10
    draw.rectangle((x, y, x + 100, y + 8 + 20 * len(workers)), fill="white", outline=GRID)
    for j, w in enumerate(workers):
        row = y + 6 + 20 * j
        draw.rectangle((x + 8, row, x + 30, row + 12), fill=COLORS[j % len(COLORS)])
        _text(img, (x + 38, row + 6), f"{w} worker{'s' if w != 1 else ''}", 12, anchor="lm")


def _starved_title(step: dict) -> str:
    if step["kind"] != "simulated":
        return f"starved % with the {step['kind']} step on {step['device']}"
    if step["step_ms"]:
        return f"starved % with a {step['step_ms']:g} ms simulated step"
    # no step: all time is loading, so ~100% says nothing; --step-ms makes this panel useful
    return "starved % with no step (pure loader speed; try --step-ms 20)"


def draw(report: dict):
    """The bench figure as a PIL image (RGB)."""
    from PIL import Image

    cells = report["cells"]
    img = Image.new("RGB", SIZE, "white")
    speed = log_axis(cells, PANELS[0][1], PANELS[0][3])
    starved = Axis(0, 100, PANELS[1][1], PANELS[1][3], log=False)
    _panel(img, PANELS[0], speed, bars(cells, "samples_per_s", speed, PANELS[0], whiskers=True),
           {"title": "loader throughput", "ylabel": "samples/s (median, min-max; log scale)"})
    _panel(img, PANELS[1], starved, bars(cells, "starved_pct", starved, PANELS[1], whiskers=False),
           {"title": _starved_title(report["step"]), "ylabel": "starved % (time waiting for data)",
            "bands": BANDS})
    _legend(img, PANELS[0], sorted({c["workers"] for c in cells}))
    d = report["data"]
    _text(img, (SIZE[0] / 2, 12), f"shardkit bench: {d['samples']} images at {d['image_size']}x{d['image_size']}, batch "
          f"{report['config']['batch_size']}, {report['machine']['cpus']} CPUs", 16, anchor="mt")
    return img


def plot_file(json_path: str, png_path: str) -> str:
    """Draw the bench plot from a bench.json into png_path; returns png_path."""
    with open(json_path, encoding="utf-8") as f:
        report = json.load(f)
    img = draw(report)
    with atomic_writer(png_path) as f:  # a killed run leaves the old plot, never half a PNG
        img.save(f, format="PNG", optimize=False)
    return png_path
