"""Where build and dedup work runs: an embedded Dask cluster (or a real one with --scheduler),
started in the background or on first use, or this process when a cluster cannot pay off."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

from shardkit.jobs.main_guard import check_main_guard

# Applied while the embedded cluster starts; None unsets a nanny default (see dask_client).
EMBEDDED_CLUSTER_CONFIG = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                           "distributed.worker.multiprocessing-method": "forkserver",
                           # Monitoring a batch build never looks at: the workers' stack sampler
                           # (every 10 ms), event-loop ticks (20 ms), system and memory monitors,
                           # and work stealing (run_tasks queues at most one task per worker). Idle,
                           # they cost 0.38 CPU-s per 5 s on two workers; 0.05 without.
                           "distributed.worker.profile.enabled": False,
                           "distributed.scheduler.work-stealing": False,
                           "distributed.admin.tick.interval": "1s",
                           "distributed.admin.system-monitor.interval": "5s",
                           "distributed.worker.memory.monitor-interval": "1s"}
# Imported once by the fork server, so that each worker it forks starts with them loaded.
FORKSERVER_PRELOAD = ["distributed", "numpy", "pyarrow", "pyarrow.ipc", "pyarrow.parquet", "PIL.Image", "PIL.JpegImagePlugin",
                      "PIL.PngImagePlugin", "shardkit.jobs.build.tasks"]
worker_log_level = logging.ERROR  # what embedded Dask workers log; `shardkit --debug` lowers it
# Set by the shardkit command (its process ends after the command): on a stop (Ctrl-C, SIGTERM) the
# embedded cluster is closed in the middle of its operations, and Dask logs each broken one as an
# error with a traceback. Those are the stop itself, not news: the command prints its one line.
quiet_on_stop = False


# Loggers of the event loop the Dask client runs on: a scatter or connection cut by the stop ends as an
# asyncio "Task exception was never retrieved" or a tornado callback error, each with its traceback.
STOP_NOISE_LOGGERS = ("asyncio", "tornado.application", "tornado.general")


def _silence_dask() -> None:
    """Drop every record of the 'distributed' loggers' handlers, and of the event loop's loggers, from
    now on (this process is stopping)."""
    for handler in logging.getLogger("distributed").handlers:
        handler.addFilter(lambda record: False)
    for name in STOP_NOISE_LOGGERS:  # records created on these loggers themselves: a logger filter sees each
        logging.getLogger(name).addFilter(lambda record: False)


def silence_for_stop() -> None:
    """In the shardkit command without --debug: Dask's records from here on are dropped (called when a
    stop begins: the SIGTERM handler, or a Ctrl-C reaching the embedded cluster's block)."""
    if quiet_on_stop and worker_log_level >= logging.ERROR and not os.environ.get("SHARDKIT_DEBUG"):
        _silence_dask()


@contextlib.contextmanager
def _stop_quietly():
    try:
        yield
    except KeyboardInterrupt:  # Ctrl-C, and SIGTERM (errors.Terminated)
        silence_for_stop()
        raise


def _workers_log_level() -> int:
    """The log level of an embedded cluster's workers (their silence_logs)."""
    # A failing task reaches the caller as its exception; the workers' own multi-line reports of it
    # are shown only with `shardkit --debug` (or SHARDKIT_DEBUG=1).
    quiet = logging.WARNING if os.environ.get("SHARDKIT_DEBUG") else worker_log_level
    if quiet_on_stop and quiet >= logging.ERROR:
        # The shardkit command reports a failed task or a lost worker itself; what a worker process
        # would add on its own stderr is a stop's teardown (a heartbeat to a scheduler that has just
        # closed), which no handler here can drop, that process being another one.
        quiet = logging.CRITICAL
    return quiet


@contextlib.contextmanager
def _threaded_cluster(n: int, quiet: int):
    """A client of an embedded LocalCluster of one worker in this process, with n threads."""
    import dask
    from distributed import Client, LocalCluster
    from PIL import Image

    # Every image plugin registered once, here: Image.open registers the rest on its first miss,
    # which two worker threads could otherwise do at the same time.
    Image.init()
    with dask.config.set(EMBEDDED_CLUSTER_CONFIG), \
            LocalCluster(n_workers=1, threads_per_worker=n, processes=False, dashboard_address=":0",
                         silence_logs=quiet) as cluster, Client(cluster) as client, _stop_quietly():
        yield client


@contextlib.contextmanager
def dask_client(scheduler: str | None, workers: int | None, threads: bool = False):
    """None for workers=0 (run in-process), else an existing cluster (`--scheduler ADDRESS`) or an
    embedded LocalCluster closed on exit: one worker process per worker, or with `threads` one worker
    in this process with that many threads (for work that mostly releases the GIL: see choose_pool)."""
    if workers == 0:
        yield None
        return
    from distributed import Client, LocalCluster

    if scheduler:
        client = Client(scheduler, timeout="30s")
        try:
            yield client
        finally:
            client.close()
        return
    n = workers or max(1, os.cpu_count() or 1)
    # One thread per worker process: PIL and the tokenizer hold the GIL for part of their work.
    # ":0": a free port for the dashboard, so two builds on one machine never collide on 8787.
    # The nanny's default MALLOC_TRIM_THRESHOLD_ also switches off glibc's adaptive mmap threshold,
    # so every decoded image buffer (> 128 KiB) becomes an mmap + munmap + page faults: 25-30% of
    # the per-image time (bench/RESULTS.md). Workers of this short-lived cluster keep the default.
    quiet = _workers_log_level()
    if threads:  # no worker process to start, no task or result copied between processes
        with _threaded_cluster(n, quiet) as client:
            yield client
        return
    with _process_cluster(n, quiet) as client:
        yield client


@contextlib.contextmanager
def _process_cluster(n: int, quiet: int):
    """An embedded LocalCluster of n worker processes, one thread each."""
    import dask
    from distributed import Client, LocalCluster

    check_main_guard("a shardkit job on worker processes (build, dedup, annotate)", main_thread=True)
    # Workers are forked from a fork server that has imported Dask and the build's modules once
    # (a spawned worker re-imports them all: ~0.4 s of CPU each before its first task, most of a
    # small build's fixed cost). The server starts with the environment the nanny prepares
    # (OMP_NUM_THREADS=1, ...) and lives as long as this process: its children inherit the
    # environment of its start, not today's, so the store's settings are passed again (store_environ).
    _preload_forkserver()
    with dask.config.set(EMBEDDED_CLUSTER_CONFIG), \
            LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                         silence_logs=quiet, env=store_environ()) as cluster, Client(cluster) as client, \
            _stop_quietly():
        yield client


# The environment a worker reads its store's credentials and settings from (boto3/obstore, gcsfs,
# adlfs, huggingface_hub, fsspec, shardkit's own switches).
STORE_ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCS_", "AZURE_", "HF_", "FSSPEC_", "SHARDKIT_")


def store_environ() -> dict:
    """This process's store settings as they are now, for worker processes: a fork server started
    by an earlier job (or a DataLoader) gives its children the environment of its own start, so a
    key exported since (a notebook's os.environ["AWS_ACCESS_KEY_ID"] = ...) would not reach them."""
    return {k: v for k, v in os.environ.items() if k.startswith(STORE_ENV_PREFIXES)}


# Seconds an embedded cluster costs before its first task runs and after its last (start-up,
# worker imports, close), measured at 2-2.5 s on a loaded 2-core machine: the work a cluster of n
# workers saves, seconds x (1 - 1/n), must exceed this for the cluster to pay off.
CLUSTER_START_SECONDS = 2.5


@dataclass(frozen=True)
class Execution:
    """Where a job's tasks run, and why (recorded in reports)."""

    mode: str  # "in-process", "embedded cluster" or "cluster"
    workers: int | None  # for dask_client: 0 in-process, None one per core
    reason: str

    def record(self) -> dict:
        n = self.workers if self.workers else (1 if self.workers == 0 else max(1, os.cpu_count() or 1))
        return {"mode": self.mode, "workers": n, "reason": self.reason}


def plan_execution(scheduler: str | None, workers: int | None, work_seconds: float | None) -> Execution:
    """In-process below the size where an embedded cluster cannot pay for its start; else a cluster.

    An address (`--scheduler`) and an explicit worker count are obeyed; only the default (workers
    None) is decided from `work_seconds`, the job's estimated single-process time (None: unknown).
    """
    if scheduler:
        return Execution("cluster", workers, f"--scheduler {scheduler}")
    if workers == 0:
        return Execution("in-process", 0, "--workers 0")
    if workers is not None:
        return Execution("embedded cluster", workers, f"--workers {workers}")
    n = max(1, os.cpu_count() or 1)
    if work_seconds is None:
        return Execution("embedded cluster", None, f"one worker per core ({n})")
    saved = work_seconds * (1 - 1 / n)
    if saved <= CLUSTER_START_SECONDS:
        return Execution("in-process", 0, f"about {work_seconds:.1f} s of work: {n} workers would save "
                         f"{saved:.1f} s, less than the {CLUSTER_START_SECONDS} s a cluster takes to start")
    return Execution("embedded cluster", None, f"about {work_seconds:.1f} s of work: {n} workers save ~{saved:.1f} s, "
                     f"more than the {CLUSTER_START_SECONDS} s a cluster takes to start")


def import_in_background() -> None:
    """Import Dask's client and cluster (and the progress bar) in a thread: ~0.5 s of a small build's
    start-up that then overlaps the listing of SRC, before the kind of cluster is decided."""
    import threading

    def load():
        import tqdm.auto  # noqa: F401 — the bar comes first, the cluster later
        import distributed  # noqa: F401

    threading.Thread(target=load, name="shardkit-import", daemon=True).start()


def forkserver_started() -> bool | None:
    """Whether this process's fork server is running: the one place that reads multiprocessing's
    private state (`forkserver._forkserver._forkserver_pid`, CPython 3.8-3.13). None when that name
    is gone (another Python): callers then take the public path (see _preload_forkserver)."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is None or not hasattr(server, "_forkserver_pid"):
        return None
    return server._forkserver_pid is not None


def _preload_forkserver() -> str:
    """Ask the fork server to import FORKSERVER_PRELOAD when it starts. Returns which path ran:
    "preloaded" (not started yet), "running" (a server already started, by an earlier cluster of this
    process or by a DataLoader, keeps what it imported: changing the list would only confuse a later
    reader of it), or "preloaded-unknown" (the private state is gone: the public call alone, which
    at worst sets a list a running server never reads)."""
    import multiprocessing

    started = forkserver_started()
    if started:
        return "running"
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
    return "preloaded" if started is False else "preloaded-unknown"


class PendingClient:
    """A Dask client started (and later closed) by a thread of its own: `start()` begins, `get()` waits
    until it is up (starting it if need be; None when running in-process). One thread enters and
    leaves dask_client: Dask keeps the current client in a context variable that must be reset where
    it was set."""

    def __init__(self, scheduler: str | None, workers: int | None, start: bool = True):
        import threading

        self._box, self._ready, self._done, self._lock = {}, threading.Event(), threading.Event(), threading.Lock()
        self._local = workers == 0
        self._embedded = not scheduler
        self.threads = False  # an embedded cluster of threads of this process (use_threads)
        self.head_threads = 1  # threads of this process that run tasks while the cluster starts (use_threads)
        self._thread = threading.Thread(target=self._hold, args=(scheduler, workers), name="shardkit-cluster",
                                        daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        with self._lock:
            if not self._thread.is_alive() and not self._ready.is_set():
                self._thread.start()

    def use_threads(self, threads: bool, head_threads: int = 1) -> None:
        """Start an embedded cluster as worker threads of this process (or not); before it starts.
        `head_threads`: how many threads of this process run tasks until it is up (run_tasks)."""
        with self._lock:
            if self.started:
                raise RuntimeError("use_threads: the cluster has already started")
            self.threads = threads and self._embedded and not self._local
            self.head_threads = max(1, head_threads)

    @property
    def in_process(self) -> bool:
        """Whether every task runs in this process: no cluster, or one of threads (use_threads)."""
        return self._local or self.threads

    def _hold(self, scheduler, workers) -> None:
        try:
            with dask_client(scheduler, workers, self.threads) as client:
                self._box["client"] = client
                self._ready.set()
                self._done.wait()
        except BaseException as e:  # noqa: BLE001 — handed to the thread that asks for the client
            self._box.setdefault("error", e)
        finally:
            self._ready.set()

    @property
    def embedded(self) -> bool:
        """Whether the cluster is this process's own (not --scheduler's, whose workers are up already)."""
        return self._embedded

    @property
    def local(self) -> bool:
        """True when the work runs in this process (workers=0): there is no cluster to wait for."""
        return self._local

    def prefer_local(self) -> None:
        """Run in this process from now on, unless the cluster was already asked for."""
        with self._lock:
            if not (self._thread.is_alive() or self._ready.is_set()):
                self._local = True

    @property
    def started(self) -> bool:
        """Whether the cluster was asked for (it may still be starting)."""
        return self._thread.is_alive() or self._ready.is_set()

    def unless_few(self, tasks: int, few: int = 4):
        """This client, or None (run in this process) for a handful of short tasks while no cluster
        is up yet: e.g. a rerun that reuses every signature file starts no cluster for its buckets."""
        return self if self.started or tasks > few else None

    def get(self):
        if self._local:
            return None
        self.start()
        self._ready.wait()
        if "client" not in self._box:
            raise self._box["error"]
        return self._box["client"]

    def close(self) -> None:
        self._done.set()
        with self._lock:
            started = self._thread.is_alive() or self._ready.is_set()
        if started:
            self._thread.join()


@contextlib.contextmanager
def background_client(scheduler: str | None, workers: int | None, start: bool = True):
    """dask_client, started in the background: the caller lists inputs and plans while workers start
    (start-up is most of a small build's fixed cost). With start=False it starts at the first get()
    (a rerun that finds everything done needs no cluster). Yields a PendingClient; closed on exit."""
    pending = PendingClient(scheduler, workers, start)
    try:
        yield pending
    finally:
        pending.close()


LazyClient = PendingClient  # the name the dedup engine knows it by: a client started on first use


def lazy_client(scheduler: str | None, workers: int | None):
    """A PendingClient started on first use (or never), closed with its cluster on exit."""
    return background_client(scheduler, workers, start=False)
