"""Where a dataset's epoch stands: epoch, resume layers, samples consumed; shared with workers."""

from __future__ import annotations

import torch

from shardkit.errors import ConfigError
from shardkit.reader.partition import MAX_LAYERS


class Position:
    """The live position (main process) and the copy DataLoader workers start from.

    The training loop's progress is counted here as batches are handed out; `publish` copies it
    into shared memory, where a worker (forked or spawned, persistent or not) reads it once when
    its iteration starts, so a late-starting worker never sees a moved start. `layers` are the
    resumes at another world size within this epoch (see partition.Stream).
    """

    def __init__(self):
        # [epoch, consumed, number of layers, (world_size, consumed) per layer]
        self._shared = torch.zeros(3 + 2 * MAX_LAYERS, dtype=torch.int64).share_memory_()
        self.epoch, self.consumed, self.layers = 0, 0, ()
        self.pinned = False  # set_epoch() since the loader's last iter(): no automatic advance

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`; the same epoch again keeps a restored position."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): expected an integer >= 0")
        self.pinned = True
        if epoch != self.epoch:
            self.jump(epoch)

    def jump(self, epoch: int, consumed: int = 0, layers=()) -> None:
        """Go to `consumed` samples into `epoch` after resume `layers` (restore, restart)."""
        layers = tuple((int(w), int(c)) for w, c in layers)
        if len(layers) > MAX_LAYERS:
            raise ConfigError(f"{len(layers)} resumes at a new world size within one epoch; at most "
                              f"{MAX_LAYERS} are kept: resume from an epoch boundary instead")
        self.epoch, self.consumed, self.layers = int(epoch), int(consumed), layers
        self.publish()

    def advance(self, samples: int) -> None:
        """Count samples handed to the training loop; workers keep the start they were given."""
        self.consumed += samples

    def publish(self) -> None:
        """Hand the position to workers: iterations started from now on begin there."""
        flat = [self.epoch, self.consumed, len(self.layers)] + [v for layer in self.layers for v in layer]
        self._shared[:len(flat)] = torch.tensor(flat, dtype=torch.int64)

    def published(self) -> tuple[int, int, tuple]:
        """(epoch, consumed, layers) as last published: what a worker's iteration starts from."""
        values = self._shared.tolist()
        n = values[2]
        return values[0], values[1], tuple(zip(values[3:3 + 2 * n:2], values[4:4 + 2 * n:2]))
