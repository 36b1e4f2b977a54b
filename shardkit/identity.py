"""Who this process is: (rank, world_size) and (worker, num_workers), from one place.

Tests override both through the environment: RANK / WORLD_SIZE, and SHARDKIT_WORKER /
SHARDKIT_NUM_WORKERS to play any DataLoader worker in-process; ranks per machine come from
LOCAL_WORLD_SIZE, as torchrun sets it.
"""

from __future__ import annotations

import os
import sys

from shardkit.errors import ConfigError


def rank_world() -> tuple[int, int]:
    """(rank, world_size) from torch.distributed when initialised, else RANK / WORLD_SIZE env."""
    dist = sys.modules.get("torch.distributed")  # never import torch just to learn the rank
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError as e:
        raise ConfigError(f"RANK/WORLD_SIZE must be integers ({e}); unset them or fix the launcher") from e


def local_world_size() -> int:
    """Ranks on this machine: LOCAL_WORLD_SIZE (set by torchrun), else 1 (one process per node).
    torch.distributed alone cannot tell: its world size counts every node's ranks."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    except ValueError as e:
        raise ConfigError(f"LOCAL_WORLD_SIZE must be an integer ({e}); unset it or fix the launcher") from e


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells, else all of them)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


WORKERS_PER_CORE = 4  # the most embedded Dask workers per core a build, dedup or build_map accepts


def check_embedded_workers(workers, scheduler: str | None, flag: str = "--workers") -> None:
    """A worker count for an embedded Dask cluster on this machine: None (one per core), 0 (in-process)
    or up to WORKERS_PER_CORE per core. More only queue for the cores, each worker a process with its
    own memory (1,000 on 2 cores never started, and Dask printed tens of thousands of lines)."""
    if workers is None:
        return
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise ConfigError(f"workers={workers!r}: expected 0 (in-process, no cluster) or more ({flag})")
    cores = usable_cores()
    if scheduler is None and workers > WORKERS_PER_CORE * cores:
        raise ConfigError(f"workers={workers}: more than {WORKERS_PER_CORE} per core of this machine's {cores} "
                          f"(at most {WORKERS_PER_CORE * cores}); more only wait for the cores, each with its own "
                          f"memory: use {flag} {cores} or leave it out (one per core), or --scheduler ADDRESS to "
                          "run on a cluster's workers")


def worker_info():
    """DataLoader's worker info in a worker process, else None (torch only if already imported)."""
    data = sys.modules.get("torch.utils.data")
    return None if data is None else data.get_worker_info()


def worker_identity() -> tuple[int, int]:
    """(worker, num_workers) of this process: DataLoader's worker info, else (0, 1)."""
    if "SHARDKIT_NUM_WORKERS" in os.environ:
        return int(os.environ.get("SHARDKIT_WORKER", 0)), int(os.environ["SHARDKIT_NUM_WORKERS"])
    info = worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
