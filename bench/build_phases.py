"""Where a build's time goes: the timeline of one build() in this process, from timers put around its
phases (listing, fields, the task run, the wait for fsync, the manifest) and the first moment the
cluster was asked for and up; plus each shard step's seconds where it ran in this process.

    PYTHONPATH=$PWD python bench/build_phases.py SRC OUT [raw|jpeg|...]

Prints one JSON line. Run it beside bench/build_pool_bench.py to see which phase a gap lies in
(e.g. OUT on /dev/shm against OUT on disk tells the disk's share).
"""
import json, sys, time, logging
from dataclasses import replace
T0 = time.perf_counter()
marks = []
def mark(name):
    marks.append((name, round(time.perf_counter() - T0, 3)))
import shardkit.jobs.build as B
import shardkit.jobs.cluster as C
import shardkit.jobs.build.tasks as BT
def timed(mod, name):
    fn = getattr(mod, name)
    def wrap(*a, **k):
        mark(name + ">")
        try:
            return fn(*a, **k)
        finally:
            mark(name + "<")
    setattr(mod, name, wrap)
for n in ("_scan", "_fields", "_run", "_durable", "_finish", "_remove_stale"):
    timed(B, n)
get = C.PendingClient.get
def get_timed(self, *a, **k):
    c = get(self, *a, **k)
    if not any(m[0] == "cluster up" for m in marks):
        mark("cluster up")
    return c
C.PendingClient.get = get_timed
shard_seconds = []
sw = BT._write
def write_timed(shard, table, parts, ctx, start):
    t = time.perf_counter(); r = sw(shard, table, parts, ctx, start); shard_seconds.append(round(time.perf_counter() - t, 3)); return r
BT._write = write_timed
def main():
    from shardkit.config import BuildConfig
    src, out, encode = sys.argv[1:4]
    cfg = BuildConfig(src=src, out=out, image_size=224, resize_mode="center-crop", encode=encode, progress=False)
    mark("start")
    res = B.build(cfg)
    mark("end")
    print(json.dumps({"encode": encode, "out": out, "samples": res.samples, "shards": len(res.shards),
                      "marks": marks, "shard_write_s_in_client": shard_seconds}))


if __name__ == "__main__":
    main()
