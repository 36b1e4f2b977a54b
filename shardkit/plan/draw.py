"""plan.png: predicted samples/s against workers, one line per decode placement, the target as a line."""

from __future__ import annotations

from shardkit.store.local import atomic_writer
from shardkit.loaderbench.plot import COLORS, GRID, INK, Axis, _text

SIZE = (760, 460)
BOX = (90, 50, 560, 400)  # the plot area; the legend goes to its right


def draw_plan(plan: dict, path: str) -> str:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", SIZE, "white")
    draw = ImageDraw.Draw(img)
    left, top, right, bottom = BOX
    curves, target = plan["curves"], plan["target_samples_per_s"]
    rates = [r for pts in curves.values() for _, r in pts if r > 0] + [target]
    axis = Axis(min(rates) / 1.5, max(rates) * 1.5, top, bottom, log=True)
    top_w = max((w for pts in curves.values() for w, _ in pts), default=1) or 1
    x = lambda w: round(left + (right - left) * w / top_w)  # noqa: E731
    for value, label in axis.ticks():
        y = axis.y(value)
        draw.line((left, y, right, y), fill=GRID if value else INK)
        _text(img, (left - 8, y), label, 12, anchor="rm")
    for w in range(0, top_w + 1):
        _text(img, (x(w), bottom + 8), str(w), 12, anchor="ma")
    draw.rectangle(BOX, outline=INK)
    _text(img, (left + (right - left) // 2, bottom + 28), "DataLoader workers", 13, anchor="ma")
    _text(img, (24, (top + bottom) // 2), "predicted samples/s", 13, angle=90)
    _text(img, (left, 18), f"{plan['dataset']}"[-70:], 13)
    ty = axis.y(target)
    draw.line((left, ty, right, ty), fill="#d62728", width=2)
    for i, (name, pts) in enumerate(curves.items()):
        color = COLORS[i % len(COLORS)]
        draw.line([(x(w), axis.y(r)) for w, r in pts], fill=color, width=3)
        draw.rectangle((right + 20, top + 22 * i, right + 34, top + 22 * i + 12), fill=color)
        _text(img, (right + 40, top + 22 * i), name, 13)
    draw.line((right + 20, top + 22 * len(curves) + 6, right + 34, top + 22 * len(curves) + 6), fill="#d62728", width=2)
    _text(img, (right + 40, top + 22 * len(curves)), f"target {target:,.0f}/s", 13)
    with atomic_writer(path, "wb") as f:
        img.save(f, format="PNG")
    return path
