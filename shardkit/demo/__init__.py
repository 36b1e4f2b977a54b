"""`python -m shardkit.demo OUT`: stream a built dataset through make_loader and the meter, print the report."""

from __future__ import annotations

import os
import sys
import time


def _describe(batch: dict) -> str:
    """One line per field: a tensor's shape and dtype; for a list (a mixed folder: some samples lack
    the field, or shapes differ) what its items are."""
    parts = []
    for name, value in sorted(batch.items()):
        if hasattr(value, "shape"):
            parts.append(f"{name}: {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}")
            continue
        present = [v for v in value if v is not None]
        kinds = sorted({f"{tuple(v.shape)} {str(v.dtype).replace('torch.', '')}" if hasattr(v, "shape")
                        else type(v).__name__ for v in present})
        missing = f", {len(value) - len(present)} missing" if len(present) < len(value) else ""
        parts.append(f"{name}: list of {len(present)} {' | '.join(kinds) or 'values'}{missing}")
    return "\n  ".join(parts)


def run(out: str, *, epochs: int = 8, batch_size: int = 32, num_workers: int = 2) -> dict:
    """Stream `epochs` epochs with a small CNN training step on the images; return the meter summary."""
    import torch

    from shardkit import StarvationMeter, StreamingDataset, make_loader

    ds = StreamingDataset(out, seed=0)
    image = next((n for n, s in ds.manifest.fields.items() if s["kind"] == "image"), None)
    model = torch.nn.Sequential(torch.nn.LazyConv2d(16, 3, stride=2), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.LazyLinear(10))
    loader = make_loader(ds, batch_size=batch_size, num_workers=num_workers)
    # The trace lets the report name the stage that holds the step (and Perfetto show it).
    trace = os.path.join(os.path.dirname(os.path.abspath(out)), "demo.trace.json")
    meter = StarvationMeter(warmup=2, log_every=1000, trace=trace)
    start, seen, first = time.perf_counter(), 0, None
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for batch in meter.wrap(loader):
            first = first or _describe(batch)
            seen += len(batch["__key__"])
            x = batch.get(image)
            if isinstance(x, list):  # a mixed folder: text-only samples have no image
                present = [t for t in x if t is not None]
                x = torch.stack(present) if present else None
            if x is not None:  # fp32: bf16 convolutions are slow on CPUs without AMX
                model(x.float().div_(255)).sum().backward()
    elapsed = time.perf_counter() - start
    print(f"streamed {seen} samples in {epochs} epochs over {len(ds.shards)} shards with "
          f"{num_workers} workers: {seen / elapsed:.0f} samples/s")
    print(f"first batch:\n  {first}")
    print(meter.report())
    summary = meter.summary()
    meter.close_trace()
    return summary


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m shardkit.demo DATASET", file=sys.stderr)
        return 2
    run(argv[0])
    return 0
