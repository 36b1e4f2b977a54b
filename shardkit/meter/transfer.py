"""The host side of a step split in three: waiting for a batch, page-locking and copying it to the
device, and the step itself, with advice naming the largest of them and its lever.

The meter cannot see a copy the training loop makes itself, so the copy goes through the meter:
`meter.wrap(loader, to="cuda")` yields batches already on the device, or `meter.to_device(batch,
"cuda")` inside a custom loop. On CUDA the copy is timed by events recorded around it on the
stream it is queued on (the current stream), read without syncing; the host also times how long
the call blocked, which is the copy itself when the batch is not page-locked (a pageable
`.to(non_blocking=True)` is a synchronous copy). On the CPU (or with an injected `copy`) it is
wall time.
"""

from __future__ import annotations

# The transfer is worth naming once it takes this share of a step; the lever is pinning while
# the batch is pageable, else moving less over the link.
TRANSFER_NOTE = 10.0


def _tensors(batch):
    """The tensors of a batch (dict, list/tuple or a tensor), in order."""
    if hasattr(batch, "is_pinned"):
        return [batch]
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return [v for v in values if hasattr(v, "is_pinned")]


def _moved(batch, fn):
    if hasattr(batch, "is_pinned"):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: fn(v) if hasattr(v, "is_pinned") else v for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(fn(v) if hasattr(v, "is_pinned") else v for v in batch)
    return batch


def torch_copy(batch, device: str, pin: bool):
    """The default copy: page-lock CPU tensors first when `pin` (timed apart), then `.to(device,
    non_blocking=True)`, which overlaps the host only from page-locked memory."""
    def one(t):
        return t.to(device, non_blocking=True) if t.device.type == "cpu" else t
    return _moved(batch, one)


def page_lock(batch):
    return _moved(batch, lambda t: t.pin_memory() if t.device.type == "cpu" and not t.is_pinned() else t)


class EventPairs:
    """CUDA event pairs (start, end[, more]) read lazily: `fold(start, end, *more)` is called for each
    pair once its end has completed, so recording them never waits for the GPU. `trim()` reads the
    finished ones once 64 are held (query() never blocks), so the list stays short; its owner calls
    it where what is held is known to count (a step's copies are held until the step is)."""

    def __init__(self, fold):
        self._fold, self._pending = fold, []

    def add(self, *pair) -> None:
        self._pending.append(pair)

    def trim(self) -> None:
        if len(self._pending) >= 64 and self._pending[0][1].query():
            self.resolve(block=False)

    def clear(self) -> None:
        self._pending.clear()

    def resolve(self, block: bool = True) -> None:
        """Fold the finished pairs (block=True: wait for the last one, then fold them all)."""
        if block and self._pending:
            self._pending[-1][1].synchronize()
        while self._pending and (block or self._pending[0][1].query()):
            self._fold(*self._pending.pop(0))


class TransferTimer:
    """Per counted step: seconds page-locking and copying, and whether the batch was pageable.

    `copy(batch, device, pin)` and `lock(batch)` may be injected (tests slow them down);
    `events` makes CUDA events (torch.cuda.Event(enable_timing=True) on CUDA, None on the CPU).
    """

    def __init__(self, clock, *, copy=None, lock=None, events=None, pin: bool = False):
        self._clock = clock
        self._copy = copy or torch_copy
        self._lock = lock or page_lock
        self._events = events
        self.pin = pin
        self._step = [0.0, 0.0, 0, 0]  # this step: page-lock s, copy s (host), copies, pageable copies
        self._pending = EventPairs(self._copied)  # CUDA events of copies not yet read
        self.lock_s = self.copy_s = self.blocked_s = 0.0
        self.pageable = self.copies = 0

    def move(self, batch, device: str):
        """The batch on `device`, page-locked first when asked; timed into the current step."""
        clock = self._clock
        if self.pin:
            t0 = clock()
            batch = self._lock(batch)
            self._step[0] += clock() - t0
        tensors = _tensors(batch)
        self._step[3] += any(t.device.type == "cpu" and not t.is_pinned() for t in tensors)
        self._step[2] += 1
        start = end = None
        if self._events is not None:
            start = self._events()
            start.record()  # on the current stream: the stream the copy is queued on
        t0 = clock()
        out = self._copy(batch, device, self.pin)
        self._step[1] += clock() - t0
        if self._events is not None:
            end = self._events()
            end.record()
            self._pending.add(start, end)
        return out

    def step_done(self, counted: bool) -> None:
        """Fold the step's figures into the totals (when counted) and start the next step."""
        if not self._step[2] and not self._step[0]:  # no copy through the meter this step: nothing to fold
            return
        lock, blocked, copies, pageable = self._step
        self._step = [0.0, 0.0, 0, 0]
        if not counted:
            self._pending.clear()
            return
        self.copies += copies
        self.pageable += pageable
        self.lock_s += lock
        self.blocked_s += blocked
        if self._events is None:
            self.copy_s += blocked
        else:
            self._pending.trim()

    def _copied(self, start, end) -> None:
        self.copy_s += start.elapsed_time(end) / 1e3

    def resolve(self, block: bool = True) -> None:
        """Read finished copy events into copy_s (block=True waits for the last)."""
        self._pending.resolve(block)

    def figures(self, wait_s: float, step_s: float) -> dict:
        """The three-way split of the host side (step_s includes the transfer), in seconds and %."""
        if not self.copies:
            return {}
        self.resolve(block=True)
        # The host side of a step: waiting + page-locking + (blocked in the copy or, on a
        # stream, the copy's duration, whichever is longer) + the rest of the step.
        copy = max(self.copy_s, self.blocked_s)
        rest = max(0.0, step_s - self.lock_s - self.blocked_s)
        total = wait_s + self.lock_s + copy + rest
        pct = (lambda s: 100.0 * s / total) if total > 0 else (lambda s: 0.0)
        return {"transfer": {"wait_s": wait_s, "page_lock_s": self.lock_s, "copy_s": copy,
                             "copy_blocked_s": self.blocked_s, "step_s": rest,
                             "wait_pct": pct(wait_s), "page_lock_pct": pct(self.lock_s), "copy_pct": pct(copy),
                             "step_pct": pct(rest), "transfer_pct": pct(self.lock_s + copy),
                             "pageable_copies": self.pageable, "copies": self.copies}}

    def state(self) -> tuple:
        return (self.lock_s, self.copy_s, self.blocked_s, self.pageable, self.copies)

    def load(self, state) -> None:
        if state:
            self.lock_s, self.copy_s, self.blocked_s, self.pageable, self.copies = state


def largest(split: dict) -> str:
    """Which part of the host side is largest: "wait", "transfer" or "step"."""
    parts = {"wait": split["wait_pct"], "transfer": split["transfer_pct"], "step": split["step_pct"]}
    return max(parts, key=parts.get)


def transfer_advice(split: dict) -> str | None:
    """The lever for page-locking and the host→device copy once they take TRANSFER_NOTE % of the
    host side of a step; None below that."""
    lock, copy = split["page_lock_pct"], split["copy_pct"]
    moving = lock + copy
    if moving < TRANSFER_NOTE:
        return None
    if split["pageable_copies"] * 2 > split["copies"]:
        return (f"the host→device copy takes {copy:.0f}% of each step: pass pin_memory=True to make_loader "
                "(the copy blocks: the batch is not page-locked)")
    if lock >= copy:
        return (f"page-locking takes {lock:.0f}% of each step: let the loader pin (make_loader(pin_memory=True) "
                "page-locks its slots once) instead of pinning every batch")
    return (f"the host→device copy takes {copy:.0f}% of each step: copy less (decode='nvjpeg' ships the "
            "encoded bytes and decodes on the GPU; uint8, not float, batches) or overlap it "
            "(non_blocking=True on a side stream)")


def split_line(split: dict) -> str:
    """'host side of a step: waiting 12%, page-lock 0%, host→device copy 70%, step 18%'."""
    return (f"host side of a step: waiting {split['wait_pct']:.0f}%, page-lock {split['page_lock_pct']:.0f}%, "
            f"host→device copy {split['copy_pct']:.0f}%, step {split['step_pct']:.0f}%")


# The training loop's thread needs a core of its own to launch kernels: workers keeping more than
# cores - CORES_FOR_LOOP busy crowd it out.
CORES_FOR_LOOP = 1.0
NOTE_FROM = 5.0  # % starved (or GPU idle) below which the run is fine whatever the cores do


def crowded(figures: dict, cpus: int) -> str | None:
    """The lever when the workers leave the training loop less than a core and the step (the host
    side of it) is the largest part: fewer workers, not more."""
    used, workers = figures.get("worker_cpu_cores"), figures.get("num_workers")
    split = figures.get("transfer")
    idle = figures.get("gpu_idle_pct", figures.get("starved_pct", 0.0))
    if used is None or used <= cpus - CORES_FOR_LOOP or idle < NOTE_FROM or (split and largest(split) != "step"):
        return None
    fewer = max(1, int(cpus - CORES_FOR_LOOP))
    return (f"the workers keep {used:.1f} of {cpus} cores busy, leaving the training loop less than a core to "
            f"launch its kernels: lower num_workers (now {workers}) to {min(fewer, workers or fewer)} or fewer "
            "(make_loader's default leaves a core)")


def with_transfer(line: str, split: dict) -> str:
    """The advice line given the split: the transfer's lever first when it is the largest part of
    the host side, added after the line when it is worth a mention, else the line unchanged."""
    lever = transfer_advice(split)
    if lever is None:
        return line
    if largest(split) == "transfer":
        return lever
    return f"{line}; also {lever}"
