"""What the recipes in pipelines/ share: split and build a raw folder once, open a training
session (loader, meter, AMP, accumulation, early stopping), train with spot-safe checkpoints,
and read the command line into a frozen recipe dataclass.

A recipe is one script that imports this module like any other part of shardkit, so each one
can be copied out of pipelines/ on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("shardkit.recipes")


@dataclass(frozen=True)
class Recipe:
    """What every recipe shares; each command-line flag is one field here."""

    src: str
    data: str
    run: str
    batch_size: int = 32
    accum_steps: int = 1
    lr: float = 3e-3
    max_steps: int = 200
    eval_every: int = 20
    ckpt_every: int = 20
    keep: int = 3
    patience: int = 5
    precision: str = "auto"
    device: str = "auto"
    num_workers: int = 1
    seed: int = 0
    val_pct: int = 10
    step_delay_ms: float = 0.0
    trace: bool = False
    build_workers: int | None = None
    # Stop signals: finish the step, checkpoint, exit 128 + signal. SIGUSR1: `sbatch --signal=USR1@120`.
    stop_signals: str = "SIGTERM,SIGUSR1"
    debug: bool = False  # other libraries' log lines too (the embedded Dask cluster's INFO)

    def __post_init__(self):
        for name in ("batch_size", "accum_steps", "max_steps", "eval_every", "ckpt_every", "keep",
                     "patience"):
            if getattr(self, name) < 1:
                raise SystemExit(f"--{name.replace('_', '-')} {getattr(self, name)}: expected a positive integer")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise SystemExit(f"--device {self.device}: expected auto, cpu, cuda or cuda:N")
        if not 0 < self.val_pct < 100:
            raise SystemExit(f"--val-pct {self.val_pct}: expected a percentage between 1 and 99")
        for name in self.signals():
            if name not in signal.Signals.__members__:
                raise SystemExit(f"--stop-signals {self.stop_signals}: {name!r} is not a signal name "
                                 "(e.g. SIGTERM,SIGUSR1)")
        if self.batch_size % self.accum_steps:
            raise SystemExit(f"--batch-size {self.batch_size} is not a multiple of --accum-steps {self.accum_steps}: "
                             "the micro-batch is batch_size / accum_steps")

    def signals(self) -> tuple[str, ...]:
        """--stop-signals as signal names: "term, usr1" → ("SIGTERM", "SIGUSR1")."""
        names = (n.strip().upper() for n in self.stop_signals.split(",") if n.strip())
        return tuple(n if n.startswith("SIG") else f"SIG{n}" for n in names)


# Loggers of the embedded Dask cluster a build starts (its scheduler and nannies run in this process):
# dozens of INFO lines per build, shown only with --debug.
DASK_LOGGERS = ("distributed", "tornado", "bokeh")


def setup_logging(recipe: Recipe) -> None:
    """INFO lines on stderr: the recipe's and shardkit's; Dask's only with --debug."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not recipe.debug:
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda record: not record.name.startswith(DASK_LOGGERS))


# -- data: split once, build once ------------------------------------------------------------
def fingerprint(src: str) -> str:
    """Hash of every file's path, size and mtime: a changed raw folder means a rebuild."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            st = os.stat(os.path.join(root, name))
            h.update(f"{os.path.relpath(os.path.join(root, name), src)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def split_folder(src: str, dst: str, val_pct: int) -> dict:
    """Hard-link (or copy) src into dst/train and dst/val, stratified by first-level folder.

    A sample's files stay together. In each folder the samples with the lowest hash of their
    stem go to val (at least one when the folder has two or more), so every class is held out
    and the split barely moves when files are added.
    """
    groups: dict[str, dict[str, list[str]]] = {}
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), src)
            folder = rel.split(os.sep, 1)[0] if os.sep in rel else ""
            groups.setdefault(folder, {}).setdefault(rel.split(".", 1)[0], []).append(rel)
    counts = {"train": 0, "val": 0}
    for stems in groups.values():
        ranked = sorted(stems, key=lambda stem: (zlib.crc32(stem.encode()), stem))
        n_val = max(1, round(len(ranked) * val_pct / 100)) if len(ranked) > 1 else 0
        for i, stem in enumerate(ranked):
            part = "val" if i < n_val else "train"
            for rel in stems[stem]:
                _link(os.path.join(src, rel), os.path.join(dst, part, rel))
                counts[part] += 1
    return counts


def _link(source: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(source, target)


def prepare(src: str, data: str, val_pct: int, make_config) -> tuple[str, str]:
    """DATA/train and DATA/val built from SRC; skipped when SRC and the build config are unchanged."""
    from shardkit.jobs.build import build
    from shardkit.store.local import atomic_write
    from shardkit.manifest import load_manifest

    train_dir, val_dir = os.path.join(data, "train"), os.path.join(data, "val")
    want = {"src": fingerprint(src), "val_pct": val_pct,
            "config": make_config(train_dir, train_dir).output_hash()}
    stamp = os.path.join(data, "recipe.json")
    if os.path.exists(stamp) and Path(stamp).read_text() == json.dumps(want, sort_keys=True):
        log.info("dataset in %s is up to date: build skipped", data)
        return train_dir, val_dir
    split = os.path.join(data, "split")
    shutil.rmtree(split, ignore_errors=True)
    log.info("split %s: %s", src, split_folder(src, split, val_pct))
    for part, out in (("train", train_dir), ("val", val_dir)):
        result = build(make_config(os.path.join(split, part), out))
        log.info("built %s: %d samples in %.1f s", out, result.samples, result.seconds)
    classes = (load_manifest(train_dir).classes, load_manifest(val_dir).classes)
    if classes[0] != classes[1]:
        raise SystemExit(f"the held-out split has classes {classes[1]} but training has {classes[0]}: "
                         "every class needs held-out samples; raise --val-pct or add images")
    atomic_write(stamp, json.dumps(want, sort_keys=True))  # last: a killed build is redone
    return train_dir, val_dir


# -- training --------------------------------------------------------------------------------
@dataclass
class Session:
    """The stateful objects of a run; `stateful` is what every checkpoint holds."""

    recipe: Recipe
    model: object
    loss_fn: object
    optimizer: object
    loader: object
    val_loader: object
    stepper: object
    meter: object
    early: object
    precision: object
    device: str
    scaler: object = None

    @property
    def stateful(self) -> dict:
        return {"model": self.model, "optimizer": self.optimizer, "scaler": self.scaler, "loader": self.loader,
                "stepper": self.stepper, "meter": self.meter, "early": self.early}


def open_session(recipe: Recipe, model, loss_fn, train_dir: str, val_dir: str, batch_transform=None) -> Session:
    """Model on the device, optimizer, loaders over DATA/train and DATA/val, meter, early stopping."""
    import torch

    from shardkit.loader import make_loader
    from shardkit.meter import StarvationMeter
    from shardkit.reader.dataset import StreamingDataset
    from shardkit.train import AccumulationStep, EarlyStopping, choose_precision, make_scaler

    device = recipe.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    precision = choose_precision(device, recipe.precision)
    scaler = make_scaler(precision)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
    # keys=True: the trace records each micro-batch's keys (packed token rows leave them out by default)
    train = StreamingDataset(train_dir, seed=recipe.seed, batch_transform=batch_transform, keys=True)
    val = StreamingDataset(val_dir, shuffle=False, batch_transform=batch_transform, keys=True)
    micro = recipe.batch_size // recipe.accum_steps
    return Session(
        recipe, model, loss_fn, optimizer,
        make_loader(train, batch_size=micro, num_workers=recipe.num_workers),
        make_loader(val, batch_size=recipe.batch_size, num_workers=0),
        AccumulationStep(optimizer, accum_steps=recipe.accum_steps, scaler=scaler),
        # On CUDA the meter also times the GPU's idle gap between steps with CUDA events.
        StarvationMeter(warmup=3, log_every=50, device=device.split(":")[0]),
        EarlyStopping(patience=recipe.patience), precision, device, scaler)


def evaluate(s: Session) -> float:
    """Mean loss over the held-out split, always in the same order."""
    import torch

    from shardkit.train import autocast, to_device

    s.val_loader.source.restart(0)  # a full pass in one fixed order, every time
    s.model.eval()
    total = count = 0.0
    with torch.no_grad(), autocast(s.precision):
        for batch in s.val_loader:
            n, batch = len(batch["__key__"]), to_device(batch, s.device)
            if not n:
                continue
            total, count = total + float(s.loss_fn(s.model, batch)) * n, count + n
    s.model.train()
    return total / max(count, 1)


class Trace:
    """RUN/trace.jsonl: process starts and each micro-batch's sample keys (for resume checks)."""

    def __init__(self, path: str | None):
        self.f = None
        if path:
            self.f = open(path, "a+b")
            self.f.seek(0, os.SEEK_END)
            if self.f.tell():  # a killed run may have left half a line
                self.f.seek(-1, os.SEEK_END)
                if self.f.read(1) != b"\n":
                    self.f.write(b"\n")

    def write(self, **record) -> None:
        if self.f:
            self.f.write((json.dumps(record, sort_keys=True) + "\n").encode())
            self.f.flush()


def train_steps(s: Session, step: int, ckpt_dir: str, trace: Trace, guard=None) -> int:
    """One pass of the loader (the rest of an epoch); returns the optimizer step reached. Once `guard`
    (a PreemptionGuard) has seen a stop signal, the step in progress finishes, is checkpointed with the
    loader's position, and the process exits (guard.exit)."""
    from shardkit.train import autocast, save_checkpoint, to_device

    r = s.recipe
    for batch in s.meter.wrap(s.loader):
        trace.write(step=step + 1, micro=s.stepper.micro, keys=batch["__key__"])
        if not batch["__key__"]:
            continue  # every sample of this batch was filtered out (e.g. text documents)
        batch = to_device(batch, s.device)
        with autocast(s.precision):
            loss = s.loss_fn(s.model, batch)
        if r.step_delay_ms:
            time.sleep(r.step_delay_ms / 1e3)  # stand-in for a slower accelerator step
        if not s.stepper(loss):
            continue
        step += 1
        if step % r.eval_every == 0:
            val = evaluate(s)
            s.early(val, step=step)
            log.info("step %d: train loss %.4f, val loss %.4f", step, float(loss.detach()), val)
        stopping = guard is not None and guard.stop_requested
        if step % r.ckpt_every == 0 or step >= r.max_steps or s.early.should_stop or stopping:
            # Only at optimizer-step boundaries: gradients mid-accumulation are not saved.
            path = save_checkpoint(ckpt_dir, s.stateful, step=step, epoch=s.loader.source.epoch, keep=r.keep)
            if stopping:
                trace.write(event="stopped", step=step, signal=guard.signal_name)
                guard.exit(f"step {step} saved to {path}")
        if step >= r.max_steps or s.early.should_stop:
            break
    return step


def fit(s: Session) -> dict:
    """Resume if a checkpoint exists, train to max_steps or early stop, report the meter."""
    import torch

    from shardkit.train import PreemptionGuard, load_checkpoint, smoke_test

    r = s.recipe
    ckpt_dir = os.path.join(r.run, "checkpoints")
    ck = load_checkpoint(ckpt_dir, s.stateful)
    step = ck.step if ck else 0
    trace = Trace(os.path.join(r.run, "trace.jsonl") if r.trace else None)
    trace.write(event="start", resumed_from=step)
    if ck is None:
        smoke = smoke_test(s.model, s.val_loader, loss_fn=s.loss_fn, steps=1, device=s.device)
        if not smoke:
            raise SystemExit(f"smoke test failed ({smoke.problem}): {smoke.message}")
    # Entered before the loader starts its workers, which then inherit it (see PreemptionGuard).
    with PreemptionGuard(r.signals()) as guard:
        while step < r.max_steps and not s.early.should_stop:
            step = train_steps(s, step, ckpt_dir, trace, guard)
    torch.save(s.model.state_dict(), os.path.join(r.run, "final.pt"))
    summary = s.meter.to_json(os.path.join(r.run, "meter.json"))
    result = {"step": step, "resumed_from": ck.step if ck else None, "best_val": s.early.best,
              "early_stopped": s.early.should_stop, "meter": summary}
    print(s.meter.report())
    print(json.dumps({k: v for k, v in result.items() if k != "meter"}))
    return result


# -- command line ----------------------------------------------------------------------------
def parse(argv, defaults: type) -> Recipe:
    """argv → a `defaults` recipe: every dataclass field becomes a --flag with its default."""
    ap = argparse.ArgumentParser(description=sys.modules[defaults.__module__].__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("data")
    ap.add_argument("run")
    for f in dataclasses.fields(defaults):
        if f.name in ("src", "data", "run"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            ap.add_argument(flag, action="store_true")
        else:
            kind = {"int": int, "float": float, "str": str, "int | None": int}[f.type]
            ap.add_argument(flag, type=kind, default=f.default)
    return defaults(**vars(ap.parse_args(argv)))
