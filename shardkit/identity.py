"""Who this process is: (rank, world_size) and (worker, num_workers), from one place.

Tests override both through the environment: RANK / WORLD_SIZE, and SHARDKIT_WORKER /
SHARDKIT_NUM_WORKERS to play any DataLoader worker in-process.
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
