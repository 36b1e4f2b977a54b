"""Training helpers: precision/autocast, accumulation, checkpoints, preemption (stop signals), early
stop, smoke test, autotune."""

from shardkit.train.amp import AccumulationStep, Precision, autocast, choose_precision, make_scaler
from shardkit.train.autotune import TuneResult, autotune_batch_size, search_largest
from shardkit.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from shardkit.train.early import EarlyStopping
from shardkit.train.preempt import PreemptionGuard
from shardkit.train.smoke import SmokeResult, classification_loss, smoke_test, to_device

__all__ = [
    "AccumulationStep", "Checkpoint", "CheckpointError", "EarlyStopping", "PreemptionGuard", "Precision", "SmokeResult",
    "TuneResult", "autocast", "autotune_batch_size", "choose_precision", "classification_loss",
    "latest_checkpoint", "list_checkpoints", "load_checkpoint", "make_scaler", "save_checkpoint",
    "search_largest", "smoke_test", "to_device",
]
