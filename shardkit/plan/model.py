"""`shardkit plan`'s model: samples/s per worker count and decode placement, and the cheapest change.

A worker's per-sample time u is what one worker measured (probe.worker_s). With w workers on
f free cores (the cores less what other processes keep busy: the load average), the workers and
the training process's own share m (unpacking, the loop) share them: rate(w) = min(min(w, f) / u,
f / (u + m)); with at most one core free, a second worker adds nothing. A remote store adds a bound per worker: its fetch-ahead
keeps `connections` GETs going, each a round trip plus the shard at one connection's rate:
net(w) = w * connections * shard_bytes / (rtt + shard_bytes / conn_rate) / bytes_per_sample.
An epoch of a remote dataset from a cold cache also waits, at its start, for the shards of its first
shuffle block (every batch of a block draws from all of them): fill(w) = rtt + block_bytes /
(w * connections * conn_rate); the block is then read at the CPU's rate, the rest of the epoch at
min(CPU, net), and the rate is the epoch's: samples / (fill + block / cpu + rest / min(cpu, net))
(the fetch of the first block is in the fill, not counted again at the network's rate); for a
dataset of many blocks it is the steady rate (12 JPEG shards of 5.5 MB, one block: 0.36 s of a
2.4 s epoch).
Placements change u: raw (decoded uint8 stored) removes the decode and adds a copy of the
decoded bytes; a smaller size scales the decode with the pixels; a lower JPEG quality scales the
field's share of it by the decode time the probe measured on stored images against their re-encodes
at that quality (probe._requality); GPU decode removes it from
the workers (the GPU's rate is not modelled: shown only where nvJPEG is present).
"""

from __future__ import annotations

SMALLER = 0.5  # the 'smaller size' change halves the side: a quarter of the pixels to decode


def image_fields(probe) -> dict:
    return {k: v for k, v in probe.fields.items() if v.get("kind") == "image"}


def encoded_fields(probe) -> dict:
    """The image fields stored encoded (JPEG, PNG, WebP): those a decode is measured for."""
    return {k: v for k, v in image_fields(probe).items() if v.get("encoding") not in ("raw", None)}


def decode_s(probe) -> float:
    """Per-sample seconds of a worker's time spent decoding encoded images (what re-encoding to raw
    removes): the decode's share of the fields' measured costs applied to the worker's time, so a
    machine busier during one part of the probe than another does not skew it."""
    dec = sum(v["decode_s"] for v in encoded_fields(probe).values())
    total = sum(v["read_s"] + v["decode_s"] for v in probe.fields.values())
    return probe.worker_s * dec / total if total > 0 and probe.kind == "dataset" else dec


def raw_bytes(probe) -> float:
    """Decoded bytes per sample of the image fields (known shape, or the probe's estimate)."""
    out = 0.0
    for v in image_fields(probe).values():
        shape = v.get("shape")
        if shape:
            n = 1
            for d in shape:
                n *= int(d)
            out += n
        else:
            out += v.get("decoded_bytes", 224 * 224 * 3)
    return out


def rate(probe, workers: int, unit_s: float | None = None, net: bool = True) -> float:
    """Predicted samples/s with `workers` workers (0: in the training process)."""
    u = probe.worker_s if unit_s is None else unit_s
    if u <= 0:
        return 0.0
    cores = max(1, probe.cores)
    free = min(cores, max(1.0, getattr(probe, "free_cores", 0.0) or cores))
    if workers == 0:
        cpu = 1.0 / (u + probe.main_s)
    else:  # u was measured with one worker under today's load: more workers gain only the free cores
        cpu = min(min(workers, free) / u, free / (u + probe.main_s) if free > 1 else 1.0 / u)
    if net and probe.remote and probe.conn_bytes_per_s and probe.bytes_per_sample > 0 and probe.shard_bytes > 0:
        per_get = probe.rtt_s + probe.shard_bytes / probe.conn_bytes_per_s
        links = max(1, workers) * probe.connections
        steady = min(cpu, links * probe.shard_bytes / per_get / probe.bytes_per_sample)
        if probe.samples <= 0:
            return steady
        first = first_block(probe)
        fill = probe.rtt_s + first * probe.bytes_per_sample / (links * probe.conn_bytes_per_s)
        return probe.samples / (fill + first / cpu + (probe.samples - first) / steady)
    return cpu


def first_block(probe) -> float:
    """Samples an epoch reads from shards fetched before its first batches can be read whole: its
    first shuffle block (unshuffled, or not known: one shard's)."""
    block = probe.block_samples or probe.shard_bytes / max(1.0, probe.bytes_per_sample)
    return float(min(probe.samples, max(1.0, block)))


def placements(probe) -> dict:
    """{placement: per-sample worker seconds} for the placements available on this machine."""
    u = probe.worker_s
    dec = decode_s(probe)
    out = {"as stored": u}
    if dec > 0:
        out["raw uint8"] = max(u * 0.05, u - dec + raw_bytes(probe) / max(1.0, probe.copy_bytes_per_s))
        if probe.gpu_decode:
            out["nvJPEG (GPU)"] = max(u * 0.05, u - dec)
    return out


def curves(probe) -> dict:
    """{placement: [(workers, samples/s)]} for 0..cores workers."""
    top = max(1, probe.cores)
    return {name: [(w, rate(probe, w, u)) for w in range(0, top + 1)] for name, u in placements(probe).items()}


def changes(probe, target: float, workers: int) -> list[dict]:
    """The changes that would feed `target`, cheapest first, each with its predicted rate and cost."""
    out = []
    top = max(1, probe.cores)
    now = rate(probe, workers)
    more = next((w for w in range(workers + 1, top + 1) if rate(probe, w) >= target), None)
    if more is not None:
        out.append({"change": f"num_workers={more}", "rate": rate(probe, more),
                    "cost": f"{more - workers} more worker process(es)", "order": 0})
    dec = decode_s(probe)
    if dec > 0 and probe.kind == "dataset":
        u_raw = placements(probe)["raw uint8"]
        added = max(0.0, raw_bytes(probe) - probe.bytes_per_sample) * probe.samples
        out.append({"change": "re-encode to raw uint8 (shardkit build --encode raw)", "rate": rate(probe, workers, u_raw),
                    "cost": f"a rebuild; +{added / 1e9:.2f} GB of storage", "order": 2, "unit": u_raw})
        encoded = encoded_fields(probe)
        total = sum(v["decode_s"] for v in encoded.values())
        for name, v in encoded.items():
            q = v.get("requality")
            if q and q["decode"] < 0.95:  # decoding less entropy-coded data: a few % to ~30% of the decode
                mine = dec * v["decode_s"] / total if total > 0 else dec  # this field's share of the decode
                u_q = max(probe.worker_s * 0.05, probe.worker_s - mine * (1 - q["decode"]))
                out.append({"change": f"re-encode {name} at JPEG quality {q['quality']} (shardkit build --quality "
                                      f"{q['quality']}; stored ~{q['from']})", "rate": rate(probe, workers, u_q),
                            "cost": f"a rebuild; {q['bytes']:.2f}x the image bytes; some detail lost", "order": 2.2,
                            "unit": u_q})
        u_small = max(probe.worker_s * 0.05, probe.worker_s - dec * (1 - SMALLER ** 2))
        out.append({"change": "store images at half the side (--image-size)", "rate": rate(probe, workers, u_small),
                    "cost": "a rebuild; a quarter of the pixels", "order": 3, "unit": u_small})
        if probe.gpu_decode:
            out.append({"change": "decode on the GPU (make_loader(decode='cuda'))",
                        "rate": rate(probe, workers, max(probe.worker_s * 0.05, probe.worker_s - dec)),
                        "cost": "GPU time for nvJPEG", "order": 1})
    if probe.kind == "folder":
        u_raw = raw_bytes(probe) / max(1.0, probe.copy_bytes_per_s) + 0.05 * probe.worker_s
        out.append({"change": "build raw uint8 shards (shardkit build SRC OUT --encode raw)", "rate": rate(probe, workers, u_raw),
                    "cost": f"a build; {raw_bytes(probe) * probe.samples / 1e9:.2f} GB of storage", "order": 2,
                    "unit": u_raw})
    if probe.remote:
        local = rate(probe, workers, net=False)
        if local > now * 1.05:
            out.append({"change": "a local cache (cache_dir kept across runs, or a local copy)", "rate": local,
                        "cost": f"{probe.bytes_per_sample * probe.samples / 1e9:.2f} GB of local disk", "order": 1,
                        "unit": probe.worker_s, "probe": _with(probe, remote=False)})
            bigger = _with(probe, shard_bytes=probe.shard_bytes * 4)
            out.append({"change": "4x larger shards (shardkit build --shard-size)", "rate": rate(bigger, workers),
                        "cost": "a rebuild", "order": 2, "unit": bigger.worker_s, "probe": bigger})
    for c in out:
        c["feeds"] = c["rate"] >= target
        unit = c.pop("unit", None)
        if not c["feeds"] and unit is not None:  # with more workers too, where that is what it takes
            w = next((w for w in range(workers + 1, top + 1) if rate(c.get("probe", probe), w, unit) >= target), None)
            if w is not None:
                c.update(change=f"{c['change']} and num_workers={w}", rate=rate(c.get("probe", probe), w, unit),
                         feeds=True, order=c["order"] + 0.5)
        c.pop("probe", None)
    return sorted(out, key=lambda c: (not c["feeds"], c["order"], -c["rate"]))


def _with(probe, **changes):
    import copy

    other = copy.copy(probe)
    for k, v in changes.items():
        setattr(other, k, v)
    return other
