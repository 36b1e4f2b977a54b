"""What held the training loop's waits, from the trace's spans, and the lever for that stage.

For each step the wait [asked, arrived] is split by what the batch that ended it was doing:
the stage its worker was in at each moment until it was ready (clipped stage spans), 'not
started' before the worker took it up (busy with an earlier batch, or blocked), and 'hand-off'
after it was ready (DataLoader's queue, pickling, unpickling, unpacking). The first wait of an
epoch is 'epoch start' as a whole: the workers take up the new epoch and refill their queues.
"""

from __future__ import annotations

HOLDERS = ("epoch start", "not started", "hand-off")


def wait_holders(ring) -> dict:
    """{what: share (%) of the main process's wait} over the ring's steps, largest first; {} when
    nothing waited or no batch spans came (a loader the trace cannot see into)."""
    held: dict = {}
    for _, t0, t1, _, _, pending in ring:
        wait = t1 - t0
        if wait <= 0:
            continue
        if any(isinstance(p, tuple) and p[0] == "epoch start" for p in pending):
            _add(held, "epoch start", wait)
            continue
        built = [p for p in pending if isinstance(p, dict)]
        if not built:
            continue
        last = max(built, key=lambda b: b["end"])
        ready = min(max(last["end"], t0), t1)
        _add(held, "hand-off", t1 - ready)
        covered = 0
        for name, start, end in last["stages"]:
            part = min(end, ready) - max(start, t0)
            if part > 0:
                _add(held, name, part)
                covered += part
        _add(held, "not started", ready - t0 - covered)
    total = sum(held.values())
    if total <= 0:
        return {}
    return {k: 100.0 * v / total for k, v in sorted(held.items(), key=lambda kv: -kv[1]) if v > 0}


def _add(held: dict, name: str, ns: int) -> None:
    if ns > 0:
        held[name] = held.get(name, 0) + ns


def stage_lever(stage: str, images: str | None, image_shape=None) -> str:
    """What would help where the wait is held by `stage` (images: the DataProfile's kind)."""
    if stage == "decode":
        if images == "encoded":
            return ("decoding holds it: store the images decoded (shardkit build --encode raw), smaller "
                    "(--image-size), or decode on the GPU (make_loader(decode='cuda'))")
        return "converting fields holds it: read only the fields the step uses (StreamingDataset(fields=...))"
    if stage in ("fetch", "network wait"):
        return ("the remote store holds it: raise fetch-ahead and connections (StreamingDataset(connections=16, "
                "fetch_ahead=16)), keep a local cache (cache_dir, cache_limit), or larger shards for a slow store")
    if stage == "read":
        return "reading shards holds it: read only the fields the step uses (StreamingDataset(fields=...)), or more workers"
    if stage == "transforms":
        return ("the transforms hold it: a batch_transform on whole batches, or the transform on the GPU "
                "in the training loop")
    if stage == "collate":
        return "collating per-sample transforms holds it: a batch_transform on whole batches instead"
    if stage == "hand-off":
        return ("batches reach the training process slower than the workers build them (queue, pickling): "
                "fields that vary in shape or are missing from some samples travel pickled, item by item; "
                "read only the fields the step uses (StreamingDataset(fields=...)), and images of one shape "
                "in every sample stack into one tensor that travels in the shared slots")
    if stage == "not started":
        return "the workers are busy with earlier batches: raise num_workers or prefetch_factor"
    return "epochs restart often: longer epochs (more data per epoch) hide the workers' restart"


def straggler(ranks: list) -> dict:
    """The rank whose waits lead (synchronous data parallelism runs at its pace): its wait against
    the median rank's, and its worst stage where it traced (what held its waits, else the loader's
    largest stage). {} with one rank."""
    if len(ranks) < 2:
        return {}
    waits = sorted(r["wait_s"] for r in ranks)
    mid = len(waits) // 2
    median = waits[mid] if len(waits) % 2 else (waits[mid - 1] + waits[mid]) / 2
    worst = max(ranks, key=lambda r: r["wait_s"])
    times = worst["wait_s"] / median if median > 0 else float("inf")
    stages = worst.get("stages") or {}
    stage = stages.get("held_by") or stages.get("slowest_stage")
    line = f"rank {worst['rank']} waits {times:.1f}x the median rank ({worst['wait_s']:.2f} s vs {median:.2f} s)"
    if stage:
        line += f"; its worst stage: {stage}"
    return {"straggler_rank": worst["rank"], "straggler_wait_x_median": times, "straggler_stage": stage,
            "straggler": line}
