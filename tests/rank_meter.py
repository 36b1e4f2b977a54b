"""One rank of the 2-process gloo test of StarvationMeter.all_ranks (tests/test_stage_advice.py):
rank 1 decodes slowly (a planted hook), so it is the straggler and decode its worst stage."""

import json
import sys
import time

import torch.distributed as dist

sys.path.insert(0, sys.argv[4])
from factory import make_dataset  # noqa: E402

from shardkit.loader import make_loader  # noqa: E402
from shardkit.meter import StarvationMeter  # noqa: E402
from shardkit.reader import decode  # noqa: E402
from shardkit.reader.dataset import StreamingDataset  # noqa: E402

rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
root, _ = make_dataset(f"{out}/ds{rank}", 64, shards=2, fields=("jpg", "cls"), size=(32, 32))
if rank == 1:
    plain = decode.column

    def slow(spec, values, *args, **kwargs):
        if spec.get("kind") == "image":
            time.sleep(0.004 * len(values))
        return plain(spec, values, *args, **kwargs)

    decode.column = slow
meter = StarvationMeter(warmup=1, log_every=0, trace=f"{out}/run.trace.json")
for _ in meter.wrap(make_loader(StreamingDataset(root, fields=["jpg", "cls"]), batch_size=4, num_workers=0)):
    time.sleep(0.002)
result = meter.all_ranks()
if rank == 0:
    with open(f"{out}/all.json", "w") as f:
        json.dump({k: v for k, v in result.items() if k != "ranks"}, f)
dist.destroy_process_group()
