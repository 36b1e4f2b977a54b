"""Spot-safe checkpoints: every stateful object (model, optimizer, scaler, loader, meter, ...) in one
atomically written file per step, the last N kept, RNG states included."""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
from dataclasses import dataclass, field

from shardkit.errors import ConfigError, ShardkitError
from shardkit.store.local import atomic_writer

log = logging.getLogger("shardkit.train")

_NAME = re.compile(r"^step-(\d{9,})\.pt$")
_TMP = re.compile(r"^step-\d{9,}\.pt\.tmp-[0-9a-f]+$")


class CheckpointError(ShardkitError):
    """A checkpoint is missing, unreadable, or does not match the objects given to restore."""


@dataclass(frozen=True)
class Checkpoint:
    """What load_checkpoint restored: the file, step, epoch and the caller's extra dict."""

    path: str
    step: int
    epoch: int
    extra: dict = field(default_factory=dict)


def checkpoint_path(directory, step: int) -> str:
    return os.path.join(str(directory), f"step-{step:09d}.pt")


def list_checkpoints(directory) -> list[tuple[int, str]]:
    """(step, path) of the complete checkpoints in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(str(directory), n))
             for n in os.listdir(directory) if (m := _NAME.match(n))]
    return sorted(found)


def latest_checkpoint(directory) -> str | None:
    """Path of the newest complete checkpoint, or None. Temp files of killed writers never match."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def _rng_state() -> dict:
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _check_objects(objects: dict) -> None:
    for name, obj in objects.items():
        if obj is not None and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise ConfigError(
                f"checkpoint object {name!r} ({type(obj).__name__}) has no state_dict/load_state_dict; "
                "pass only stateful objects (model, optimizer, scaler, loader, meter, ...) or None"
            )


def save_checkpoint(directory, objects: dict, *, step: int, epoch: int = 0, extra: dict | None = None,
                    keep: int = 3) -> str:
    """Write `directory/step-<step>.pt` atomically with every object's state_dict; keep the last `keep`.

    `objects` maps a name to anything with state_dict()/load_state_dict() (None entries are
    skipped), e.g. {"model": m, "optimizer": opt, "scaler": scaler, "loader": loader, "meter": meter}.
    A kill at any moment leaves the previous checkpoints intact. Call it from one process (rank 0).
    """
    import torch

    if not isinstance(keep, int) or keep < 1:
        raise ConfigError(f"keep={keep!r}: expected a positive number of checkpoints to keep (--keep)")
    _check_objects(objects)
    payload = {"step": int(step), "epoch": int(epoch), "extra": dict(extra or {}), "rng": _rng_state(),
               "state": {k: v.state_dict() for k, v in objects.items() if v is not None}}
    path = checkpoint_path(directory, step)
    with atomic_writer(path, "wb") as f:
        torch.save(payload, f)
    _prune(directory, keep)
    return path


def _prune(directory, keep: int) -> None:
    for _, old in list_checkpoints(directory)[:-keep]:
        os.remove(old)
    # Temp files left by writers that were killed mid-save (one writer per directory).
    for name in os.listdir(directory):
        if _TMP.match(name):
            os.remove(os.path.join(str(directory), name))


def load_checkpoint(path, objects: dict, *, strict: bool = True) -> Checkpoint | None:
    """Restore `objects` (same names as saved) and the RNG states from a file or the newest in a folder.

    Returns None when `path` is a folder with no checkpoint yet (a fresh start). With strict=True
    a name saved but not given, or given but not saved, is an error naming both lists.
    The file is unpickled (it holds loader state): load only checkpoints you wrote.
    """
    import torch

    _check_objects(objects)
    if os.path.isdir(path) or not str(path).endswith(".pt"):  # a folder (maybe not made yet)
        path = latest_checkpoint(path)
        if path is None:
            return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {e}; delete it to resume from the one before") from e
    saved, given = set(payload["state"]), {k for k, v in objects.items() if v is not None}
    if strict and saved != given:
        raise CheckpointError(
            f"checkpoint {path!r} holds {sorted(saved)} but {sorted(given)} were given to restore; "
            "pass the same names as at save time, or strict=False to restore the common ones"
        )
    for name in sorted(saved & given):
        objects[name].load_state_dict(payload["state"][name])
    _set_rng_state(payload["rng"])
    log.info("resumed from %s (step %d, epoch %d)", path, payload["step"], payload["epoch"])
    return Checkpoint(str(path), payload["step"], payload["epoch"], payload["extra"])
