"""The meter's verdict: the band a starvation figure falls in, and advice that fits what was
measured and what the data already is."""

from __future__ import annotations

import os
from dataclasses import dataclass

from shardkit.errors import ConfigError
from shardkit.meter.stages import stage_lever

# Bands of the TensorFlow profiler's input-pipeline analysis (fraction of step time waiting).
FINE_BELOW = 5.0
INPUT_BOUND_FROM = 20.0


def band(starved_pct: float) -> str:
    """'fine' (< 5%), 'moderately input-bound' (5-20%) or 'input-bound' (>= 20%)."""
    if starved_pct < FINE_BELOW:
        return "fine"
    return "moderately input-bound" if starved_pct < INPUT_BOUND_FROM else "input-bound"


MIN_STEPS = 20  # fewer measured steps than this tell little beyond start-up
EPOCH_START_NOTE = 25.0  # % of the waiting spent on epochs' first batches worth a mention
IMAGE_STORES = ("raw", "encoded", "files")


@dataclass(frozen=True)
class DataProfile:
    """What the data already is, so that advice never asks for what is done.

    images: "raw" (decoded uint8 in shards: nothing left to decode), "encoded" (JPEG/PNG/WebP in
    shards, decoded every epoch), "files" (a raw folder, opened, decoded and resized every epoch),
    or None (no images, or a loader the meter cannot see into). image_shape: (H, W) when fixed.
    """

    images: str | None = None
    image_shape: tuple[int, int] | None = None

    def __post_init__(self):
        if self.images is not None and self.images not in IMAGE_STORES:
            raise ConfigError(f"images={self.images!r}: expected one of {', '.join(IMAGE_STORES)} or None "
                              "(DataProfile(images=...))")


def profile_of(loader) -> DataProfile:
    """The DataProfile of a shardkit loader (or StreamingDataset) from its manifest's image fields;
    an empty profile for anything else."""
    dataset = getattr(loader, "source", None) or getattr(loader, "dataset", loader)  # make_loader: .source
    if reads_files(dataset):
        return DataProfile("files")
    fields = getattr(dataset, "field_specs", None)  # StreamingDataset and Mixture
    if not isinstance(fields, dict):
        fields = getattr(getattr(dataset, "manifest", None), "fields", None)
    if not isinstance(fields, dict):
        return DataProfile()
    read = getattr(dataset, "fields", None) or list(fields)
    images = [fields[f] for f in read if f in fields and fields[f].get("kind") == "image"]
    if not images:
        return DataProfile()
    if all(spec.get("encoding") == "raw" for spec in images):
        shape = images[0].get("shape")
        return DataProfile("raw", tuple(shape[:2]) if shape else None)
    return DataProfile("encoded")


FILE_LISTS = ("samples", "imgs", "files", "paths", "file_paths", "image_paths")
FOLDER_CLASSES = ("DatasetFolder", "ImageFolder")  # torchvision's, matched by name: no torchvision import


def reads_files(dataset) -> bool:
    """A dataset that opens files every epoch: torchvision's ImageFolder / DatasetFolder (or a
    subclass), or one holding a list of file paths (or of (path, label) pairs)."""
    if any(cls.__name__ in FOLDER_CLASSES for cls in type(dataset).__mro__):
        return True
    for name in FILE_LISTS:
        items = getattr(dataset, name, None)
        if isinstance(items, (list, tuple)) and items:
            first = items[0][0] if isinstance(items[0], (list, tuple)) and items[0] else items[0]
            if isinstance(first, (str, os.PathLike)):
                return True
    return False


def advice(figures: dict, *, num_workers: int | None = None, cpus: int | None = None,
           data: DataProfile | None = None) -> str:
    """One line naming the likely lever, from what was measured (`figures`: a summary() dict or
    the same keys) and what the data already is (`data`)."""
    pct = figures.get("gpu_idle_pct", figures["starved_pct"])
    steps = figures.get("steps", MIN_STEPS)
    if pct < FINE_BELOW:
        return "the input pipeline keeps up: no change needed" + (
            f" (only {steps} steps measured)" if steps < MIN_STEPS else "")
    if steps < MIN_STEPS:
        return (f"only {steps} steps measured after the warm-up: too few to tell start-up from steady "
                "loading; measure a longer run")
    wait_p50, step_p50 = figures["wait_p50_ms"], figures.get("step_p50_ms")
    if "gpu_idle_pct" not in figures and step_p50 is not None and step_p50 < 0.05 * max(wait_p50, 1e-6):
        return (f"the step takes almost no time (p50 {step_p50:.2f} ms vs {wait_p50:.1f} ms waiting): "
                "starved % measures the loader alone here; compare samples/s, or time a real step "
                "(shardkit bench --step-ms N or --gpu)")
    share, steady = figures.get("epoch_start_wait_pct", 0.0), figures.get("steady_starved_pct", pct)
    data = data or DataProfile()
    held = held_by(figures)
    epochs = figures.get("epochs") or 0
    per_epoch = (steps + figures.get("warmup_steps", 0)) / epochs if epochs else float("inf")
    if share >= EPOCH_START_NOTE and steady < FINE_BELOW:
        return (f"{share:.0f}% of the waiting is for the first batch of an epoch (workers refilling their "
                f"queues); between epoch starts the loader keeps up ({steady:.1f}% starved): this fades "
                "as epochs get longer (more data per epoch)")
    if share >= EPOCH_START_NOTE and epochs > 1 and per_epoch < MIN_STEPS:
        # A tiny dataset: each epoch is a few batches, and restarting the workers for every one of
        # them is much of the waiting. Its levers would not be those of a real run's steady loading.
        line = (f"the dataset is too small to judge: an epoch is about {per_epoch:.0f} batches, and {share:.0f}% of the waiting is at the starts of its {epochs} epochs (the workers "
                "take up each new epoch and refill their queues); measure on at least "
                f"{MIN_STEPS} batches an epoch (more samples or a smaller batch)")
        if held is not None and held[0] != "epoch start":
            line += f". Between starts the wait is held by {held[0]} ({held[1]:.0f}%): {stage_lever(held[0], data.images)}"
        return line
    if held is not None and held[0] != "epoch start" and held[1] >= HELD_SHARE:  # traced: the stage is seen
        lever = f"the wait is held by {held[0]} ({held[1]:.0f}% of it, from the trace): {stage_lever(held[0], data.images)}"
    else:
        lever = _lever(figures, num_workers, cpus or os.cpu_count() or 1, data)
    if share >= EPOCH_START_NOTE:
        lever += f"; {share:.0f}% of the waiting is at epoch starts, which fades as epochs get longer"
    return lever


def _bursts(figures: dict) -> bool:
    """Most batches are ready when asked (median wait <= 10% of the step) yet the slowest 5% of
    steady waits (epoch starts left out) are 4x the median: prefetch can absorb that. When the
    median wait itself is a good part of the step, the workers are too slow on average instead."""
    p50, step = figures["wait_p50_ms"], figures.get("step_p50_ms")
    if step is not None and p50 > 0.1 * step:
        return False
    return figures.get("steady_wait_p95_ms", figures["wait_p95_ms"]) > 4 * max(p50, 1e-6)


HELD_SHARE = 40.0  # % of the wait one traced stage must hold for the advice to name it as the lever


def held_by(figures: dict) -> tuple[str, float] | None:
    """(stage, % of the wait) that held the training loop most, from a traced run; None untraced."""
    wait = (figures.get("stages") or {}).get("wait") or {}
    return next(iter(wait.items()), None)


NETWORK_SHARE = 0.5  # of the readers' time spent waiting for remote shards: the network is the lever
FETCH_CPU_SHARE = 0.2  # of the workers' CPU spent fetching (GETs, writes into the cache): a lever worth naming


def network_share(figures: dict, num_workers: int | None) -> float:
    """The share of the readers' time spent waiting on the network: `network_wait_s` (summed over
    workers, StreamingDataset.io_stats()) over the workers' time (wait_s + step_s each), or over
    the waits when the training process reads (num_workers=0). 0 when not measured."""
    waited = figures.get("network_wait_s") or 0.0
    if waited <= 0 or "wait_s" not in figures:
        return 0.0
    span = figures["wait_s"] if not num_workers else num_workers * (figures["wait_s"] + figures.get("step_s", 0.0))
    return waited / span if span > 0 else 0.0


def _lever(figures: dict, num_workers: int | None, cpus: int, data: DataProfile) -> str:
    work = "reading" if data.images == "raw" else "decoding"
    share = network_share(figures, num_workers)
    if share >= NETWORK_SHARE:
        return (f"waiting on the network: readers spent {min(share, 1.0):.0%} of their time waiting for remote "
                "shards; raise fetch-ahead and connections (StreamingDataset(connections=16, "
                "fetch_ahead=16)), or a larger cache_limit so shards stay cached")
    if num_workers == 0:
        return (f"data loads in the training process: set num_workers (up to {cpus} cores here) "
                f"so {work} overlaps the step")
    if num_workers and figures.get("worker_cpu_cores") is not None and not _bursts(figures):
        return ranked_levers(figures, num_workers, cpus, data)
    if num_workers is not None and num_workers < cpus:
        return (f"raise num_workers (now {num_workers}, {cpus} cores) and prefetch_factor "
                "so more batches are ready before the step asks (a guess: the workers' CPU was not measured)")
    if _bursts(figures):
        return ("waits come in bursts: raise prefetch_factor (or the shuffle buffer's refill size) "
                "to smooth them out")
    if data.images == "files":
        return ("workers are saturated decoding and resizing files every epoch: build shards once "
                "(shardkit build SRC OUT --image-size N --encode raw stores decoded uint8)")
    if data.images == "encoded":
        return ("workers are saturated decoding images: cache them decoded "
                "(shardkit build --encode raw for uint8 shards) or store smaller images (--image-size)")
    if data.images == "raw":
        size = f" ({data.image_shape[0]}x{data.image_shape[1]})" if data.image_shape else ""
        return (f"workers are saturated although the images are stored decoded{size}: only copying is "
                f"left, so {raw_levers(data)}")
    return ("workers are saturated: cut per-sample work in the dataset and its transforms (e.g. "
            "images decoded every epoch: shardkit build --encode raw), or add cores")


SMALL_IMAGE_SIDE = 96  # px: images this small are not made cheaper by storing them smaller


def raw_levers(data: DataProfile) -> str:
    """What is left for decoded images: smaller ones (unless already small), fewer fields, cores."""
    small = data.image_shape is not None and max(data.image_shape) <= SMALL_IMAGE_SIDE
    return ("" if small else "store smaller images (--image-size), ") + (
        "read only the fields the step uses (StreamingDataset(fields=...)), or add cores")


def cost_line(starved_pct: float) -> str:
    return f"of every 100 GPU-hours, {starved_pct:.1f} were spent waiting for data"


# What cutting per-sample work can give, from the reference figures (BENCHMARKS.md, 2 workers):
# a raw folder decoded and resized every epoch 244/s vs uint8 shards 19,462/s (>= 40x the
# target); 224-px JPEG shards 3,959/s vs uint8 shards 19,462/s (~5x).
BUILD_GAIN = {"files": 40.0, "encoded": 5.0}
BUILD_LEVER = {
    "files": "build shards once (shardkit build SRC OUT --image-size N --encode raw): the workers "
             "decode and resize files every epoch",
    "encoded": "cache the images decoded (shardkit build --encode raw) or store smaller ones "
               "(--image-size): the workers decode them every epoch",
}


def needed_speedup(pct: float) -> float:
    """Starved p% of the time: the loader must get 1 / (1 - p) times faster to keep up."""
    return 1.0 / max(1e-6, 1.0 - pct / 100.0)


def levers(figures: dict, num_workers: int, cpus: int, data: DataProfile) -> list[tuple[float | None, str]]:
    """(the most speed-up it can give, what to do) for each lever, from what was measured, the
    smallest change first:
    - fetch-ahead / connections: removes the network wait w, so at most 1 / (1 - w);
    - a local copy: removes the CPU share f the workers spend fetching, so at most 1 / (1 - f);
    - more workers: at most cores / cores the workers keep busy (15 of 16 busy: 16/15). Time they
      spend blocked on the network counts as used here: more workers help there only as far as the
      store gives more bandwidth, which the meter cannot see;
    - less work per sample (build shards): the reference gain of the data's kind, None unknown."""
    used = figures["worker_cpu_cores"]
    net = figures.get("network_wait_pct", 0.0) / 100.0
    fetch = figures.get("fetch_cpu_pct", 0.0) / 100.0
    busy = used + net * num_workers
    more = cpus / max(busy, 0.05 * num_workers) if num_workers < cpus else 1.0
    out = []
    if net > 0:
        out.append((1.0 / max(1e-6, 1.0 - net), f"raise fetch-ahead and connections to the store: the workers "
                                                f"wait on the network {100 * net:.0f}% of the time"))
    if fetch >= FETCH_CPU_SHARE:  # the fetch, not the decode, holds the workers' cores
        out.append((1.0 / max(1e-6, 1.0 - fetch), f"the workers spend {100 * fetch:.0f}% of their CPU fetching "
                                                  "remote shards, not decoding: read a local copy (copy the dataset "
                                                  "to local disk, or keep cache_dir across runs: a second epoch "
                                                  "fetches nothing)"))
    out.append((more, f"raise num_workers (now {num_workers}, keeping {used:.1f} of {cpus} cores busy) "
                      "and prefetch_factor"))
    if data.images in BUILD_LEVER:
        out.append((BUILD_GAIN[data.images], BUILD_LEVER[data.images]))
    elif data.images == "raw":  # stored decoded: nothing left to cache, only copying to cut
        size = f" ({data.image_shape[0]}x{data.image_shape[1]})" if data.image_shape else ""
        out.append((None, f"the images are stored decoded{size}, so only copying is left: {raw_levers(data)}"))
    else:
        out.append((None, "cut per-sample work in the dataset and its transforms (e.g. images decoded "
                          "every epoch: shardkit build --encode raw), or add cores"))
    return out


def ranked_levers(figures: dict, num_workers: int, cpus: int, data: DataProfile) -> str:
    """The lever that can give the speed-up needed first (else the one that gives most), and
    what more workers could give when that is not them."""
    pct = figures.get("gpu_idle_pct", figures["starved_pct"])
    need = needed_speedup(pct)
    options = levers(figures, num_workers, cpus, data)
    known = sorted((o for o in options if o[0] is not None), key=lambda o: -o[0])
    enough = [o for o in known if o[0] >= need]
    # Enough: the smallest change that does it, the first in the list of levers. None: the biggest
    # known, unless it is still below 1.25x and an unmeasured one (cutting work) may do more.
    if enough:
        best = next(o for o in options if o in enough)
    elif known and known[0][0] >= 1.25:
        best = known[0]
    else:
        best = next(o for o in options if o[0] is None) if any(o[0] is None for o in options) else known[0]
    gain = f" (up to {best[0]:.1f}x)" if best[0] is not None else ""
    line = f"needs {need:.2f}x today's loader speed ({pct:.0f}% starved): {best[1]}{gain}"
    more = next(o for o in options if o[1].startswith("raise num_workers"))
    if best is not more:
        line += (f"; more workers give at most {more[0]:.2f}x ({num_workers} workers keep "
                 f"{figures['worker_cpu_cores']:.1f} of {cpus} cores busy)")
    return line
