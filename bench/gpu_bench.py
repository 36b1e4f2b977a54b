"""The GPU figures in one run on a GPU machine, or a small CPU-fallback run.

Sections P, S, W, N (bench/gpu_feed.py) find what stands between the workers and the step;
K runs bench/build_pool_bench.py on this machine's cores. The device run of all of them, with the
wheels it needs installed first, is bench/device_run.sh (<= 10 minutes on 16 cores):
  bash bench/device_run.sh
A dry run of every section on the CPU, tiny (no CUDA needed; decode="nvjpeg" reports why not):
  python bench/gpu_bench.py --smoke --out /tmp/gpu_bench_smoke

  A. raw 224² into device memory, batch 256, 15 workers: not pinned vs pinned (page-locked slots)
  B. R ranks x W workers on one machine (LOCAL_WORLD_SIZE=R, default num_workers), all at once:
     each rank's raw 224² into device memory
  C. JPEG 224² into device memory: decode in the workers (cpu) vs nvJPEG in the main process (cuda)
  D. resnet18 bf16 channels_last on JPEG shards (decode="cuda") vs the same model on a batch
     already resident on the device (its ceiling); GPU idle from the meter's CUDA events
  E. slots lent vs copied out (the host copy every pinned batch paid before), interleaved x3

GPU (targets: A >= 100k img/s, B every rank >= 12k, C >= 35k, D >= 0.97 of synthetic):
  python bench/gpu_bench.py --out /tmp/gpu_bench
CPU fallback (keeps the script alive where no GPU is; figures mean little):
  python bench/gpu_bench.py --cpu --out /tmp/gpu_bench_cpu
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = dict(images=6000, size=224, batch=256, workers=15, ranks=8, seconds=6.0, model="resnet18")
CPU = dict(images=256, size=64, batch=32, workers=2, ranks=2, seconds=2.0, model="small")
# Sections P/S/W/N/K: window lengths, sweep, profiler steps, build bench sizes (the device run: FEED)
FEED = dict(window=20.0, windows=3, sweep_seconds=4.0, sweep_workers="6,8,12,15", profile_steps=24,
            c_window=5.0, build_images="2000,12000", build_reps=1)
SMOKE = dict(images=96, size=32, batch=8, workers=2, ranks=2, seconds=0.5, model="small", window=0.5, windows=3,
             sweep_seconds=0.3, sweep_workers="1,2", profile_steps=20, c_window=0.3, build_images="24,48",
             build_reps=1)


def data(args):
    """Generated photo-like images built to JPEG and raw uint8 shards (cached under --out)."""
    from shardkit.loaderbench.settings import BenchConfig
    from shardkit.loaderbench.data import prepare

    cfg = BenchConfig(out=args.out, cache_dir=os.path.join(args.out, "cache"), images=args.images,
                      image_size=args.size, progress=False, plot=False)
    return prepare(cfg)


def loader(root, field, args, workers=None, **options):
    from shardkit.loader import make_loader
    from shardkit.reader.dataset import StreamingDataset

    ds = StreamingDataset(root, fields=[field, "cls"], seed=0)
    return make_loader(ds, batch_size=args.batch, num_workers=workers, **options)


def rate_into_device(ld, field, device, seconds, warm=5):
    """Images/s of batches copied into device memory (non_blocking, one sync at the end)."""
    n, start, seen = 0, None, 0
    while True:
        for batch in ld:
            x = batch[field]
            x = x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x
            seen += 1
            if seen == warm:
                _sync(device)
                start = time.perf_counter()
            elif start is not None:
                n += len(batch["__key__"])
                if time.perf_counter() - start >= seconds:
                    _sync(device)
                    return n / (time.perf_counter() - start)
            del batch, x


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def section_a(d, args, device):
    from shardkit.loader import memory

    out = {}
    for pin in (False, True):  # interleaved order is not needed: each is one steady stream
        ld = loader(d.raw_root, "raw", args, args.workers, pin_memory=pin and device.type == "cuda")
        name = ("pinned" if device.type == "cuda" else "again (no CUDA: not pinned)") if pin else "not pinned"
        out[name] = rate_into_device(ld, "raw", device, args.seconds)
        del ld
    out["page_lock path"] = memory.PATHS.get("page_lock", "not tried")
    return out


def section_e(d, args, device):
    """Slots lent as they are vs copied out (the copy every pinned batch paid before page-locked
    slots), interleaved three times; on CPU this is the host side of A's gain."""
    rates = {"lent": [], "copied out": []}
    for _ in range(3):
        for mode in rates:
            ld = loader(d.raw_root, "raw", args, args.workers, pin_memory=False)
            ld._transport.copy_out = mode == "copied out"
            rates[mode].append(rate_into_device(ld, "raw", device, args.seconds))
            del ld
    out = {mode: sum(r) / len(r) for mode, r in rates.items()}
    out["lent / copied"] = out["lent"] / out["copied out"]
    return out


def section_b(d, args):
    """R child processes as torchrun would start them; each measures the same wall-clock window."""
    start_at = time.time() + 5.0 + 0.5 * args.ranks
    env = dict(os.environ, LOCAL_WORLD_SIZE=str(args.ranks), WORLD_SIZE=str(args.ranks))
    same = [f"--{k}={getattr(args, k)}" for k in ("batch", "seconds", "size")]
    procs = [subprocess.Popen([sys.executable, __file__, "--child", str(start_at), "--raw-root", d.raw_root]
                              + same + (["--cpu"] if args.cpu else []), env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(args.ranks)]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    return {f"rank {r['rank']} ({r['workers']} workers)": r["rate"] for r in results}


def child(args, start_at):
    device = _device(args)
    ld = loader(args.raw_root, "raw", args)  # default num_workers: cores / LOCAL_WORLD_SIZE
    it = iter(ld)
    for _ in range(3):
        next(it)  # workers up before the shared window
    del it
    time.sleep(max(0.0, start_at - time.time()))
    rate = rate_into_device(ld, "raw", device, args.seconds, warm=1)
    print(json.dumps({"rank": int(os.environ["RANK"]), "workers": ld.num_workers, "rate": rate}))


def section_c(d, args, device):
    out = {}
    for decode in ("cpu", "cuda"):
        ld = loader(d.jpeg_root, "jpg", args, args.workers, decode=decode)
        gpu = ld._transport is not None and ld._transport.ship_encoded
        out[f"decode={decode}" + ("" if decode == "cpu" or gpu else " (fell back to cpu)")] = \
            rate_into_device(ld, "jpg", device, args.seconds)
        del ld
    return out


def model_step(args, device, classes):
    if args.model == "resnet18":
        import torchvision

        from shardkit.loaderbench.model import ModelStep

        step = ModelStep(classes, str(device))
        step.model = torchvision.models.resnet18(num_classes=classes).to(device, memory_format=torch.channels_last)
        step.optimizer = torch.optim.SGD(step.model.parameters(), lr=0.05, momentum=0.9)
        return step
    from shardkit.loaderbench.model import ModelStep

    return ModelStep(classes, str(device), width=8)


def section_d(d, args, device):
    step = model_step(args, device, len(d.classes))
    step.warm(args.batch, args.size)
    x = torch.randint(0, 255, (args.batch, 3, args.size, args.size), dtype=torch.uint8, device=device)
    y = torch.zeros(args.batch, dtype=torch.int64, device=device)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        step(x, y)
        n += args.batch
    _sync(device)
    synthetic = n / (time.perf_counter() - start)
    out = {"synthetic": synthetic}
    # Both decode paths: the workers' CPU (the default) and nvJPEG in the main process, which shares
    # the main process's core and the GPU with the model step.
    for decode in ("cpu", "cuda") if device.type == "cuda" else ("cpu",):
        rate, s = _train_on_shards(d, args, device, step, decode)
        out.update({f"JPEG shards, decode={decode}": rate, f"ratio, decode={decode}": rate / synthetic,
                    f"GPU idle %, decode={decode}": s.get("gpu_idle_pct"),
                    f"host wait %, decode={decode}": s["starved_pct"], f"advice, decode={decode}": s["advice"]})
    return out


def _train_on_shards(d, args, device, step, decode):
    """Images/s of the model step fed from the JPEG shards (whole epochs after a 10-step warm-up),
    and the meter's summary."""
    from shardkit.meter import StarvationMeter

    ld = loader(d.jpeg_root, "jpg", args, args.workers, decode=decode)
    meter = StarvationMeter(warmup=10, log_every=0, device=device.type)
    n, steps, start = 0, 0, None
    while start is None or time.perf_counter() - start < args.seconds:  # whole epochs, as training reads them
        for batch in meter.wrap(ld):
            step(batch["jpg"], batch["cls"])
            steps += 1
            if steps == 10:  # the meter's warm-up: workers starting, cuDNN picking kernels
                _sync(device)
                start = time.perf_counter()
            elif start is not None:
                n += len(batch["__key__"])
    _sync(device)
    rate = n / (time.perf_counter() - start)
    del ld
    return rate, meter.summary()


def section_k(args):
    """bench/build_pool_bench.py on this machine (the 16-core build: incremental rate, fixed start)."""
    cmd = [sys.executable, os.path.join(HERE, "build_pool_bench.py"), "--images", args.build_images,
           "--reps", str(args.build_reps), "--workdir", os.path.join(args.out, "build-pool")]
    run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])))
    lines = (run.stdout + run.stderr).strip().splitlines()
    return {"command": " ".join(cmd), "exit": run.returncode,
            **{f"line {i}": line for i, line in enumerate(lines[-6:])}}


def _device(args):
    if args.cpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit("gpu_bench: no CUDA device is visible; run with --cpu for the CPU-fallback run")
    return torch.device("cuda")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="the small CPU-fallback run (no GPU needed)")
    p.add_argument("--out", default="/tmp/shardkit-gpu-bench")
    p.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--raw-root", default=None, help=argparse.SUPPRESS)
    p.add_argument("--sections", default=None, help="which sections to run, e.g. ab (default abcde; "
                   "--smoke: pswnk)")
    p.add_argument("--smoke", action="store_true", help="every section tiny on the CPU (a dry run of the device run)")
    for key, value in FEED.items():
        p.add_argument(f"--{key.replace('_', '-')}", dest=key, type=type(value), default=None,
                       help=f"default {value} (--smoke: {SMOKE[key]})")
    for key, value in GPU.items():
        if key != "model":
            p.add_argument(f"--{key}", type=type(value), default=None, help=f"default {GPU[key]} (--cpu: {CPU[key]})")
    args = p.parse_args(argv)
    args.cpu = args.cpu or args.smoke
    for key, value in {**FEED, **(SMOKE if args.smoke else CPU if args.cpu else GPU)}.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.sweep_workers = [int(w) for w in str(args.sweep_workers).split(",")]
    args.sections = args.sections or ("pswnk" if args.smoke else "abcde")
    if args.model == "resnet18":
        try:
            import torchvision  # noqa: F401
        except ImportError:
            print("torchvision missing (pip install 'shardkit[gpu]'): section D uses shardkit's small CNN", flush=True)
            args.model = "small"
    if args.child is not None:
        return child(args, args.child)
    device = _device(args)
    os.makedirs(args.out, exist_ok=True)
    sys.path.insert(0, HERE)
    import gpu_feed

    bench = sys.modules[__name__]
    d = data(args)
    report = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "cores": os.cpu_count(), "torch": torch.__version__, "images": d.samples, "size": args.size,
              "batch": args.batch, "workers": args.workers}
    sections = {"a": ("A raw into device memory, img/s", lambda: section_a(d, args, device)),
                "b": (f"B {args.ranks} ranks at once, default workers, raw into device, img/s per rank",
                      lambda: section_b(d, args)),
                "c": ("C JPEG into device memory, img/s", lambda: section_c(d, args, device)),
                "d": (f"D {args.model} bf16 on JPEG shards vs device-resident batch, img/s",
                      lambda: section_d(d, args, device)),
                "e": ("E slots lent vs copied out (no pinning), raw into device, img/s",
                      lambda: section_e(d, args, device)),
                "p": (f"P torch.profiler over {args.profile_steps} steps of D, decode=cpu",
                      lambda: gpu_feed.section_p(bench, d, args, device)),
                "s": ("S sweep workers x library threads x pin_memory, D decode=cpu, of synthetic",
                      lambda: gpu_feed.section_s(bench, d, args, device)),
                "w": (f"W D over {args.windows} windows of {args.window:g} s: default, cuda, nvjpeg",
                      lambda: gpu_feed.section_w(bench, d, args, device)),
                "n": ("N C decode=nvjpeg beside a training step, img/s",
                      lambda: gpu_feed.section_n(bench, d, args, device)),
                "k": (f"K build_pool_bench at {os.cpu_count()} cores", lambda: section_k(args))}
    for key in args.sections:
        title, run = sections[key]
        t0 = time.perf_counter()
        try:
            report[title] = run()
        except Exception as e:  # one section failing must not cost the others' figures on a lent device
            import traceback

            report[title] = {"failed": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
        print(f"## {title} ({time.perf_counter() - t0:.0f} s)", flush=True)
        for name, value in report[title].items():
            print(f"  {name}: {value:,.2f}" if isinstance(value, float) else f"  {name}: {value}", flush=True)
        with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:  # after each section: a cut run keeps them
            json.dump(report, f, indent=2, default=str)


if __name__ == "__main__":
    main()
