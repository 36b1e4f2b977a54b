"""What make_loader's DataLoader iterates: a dataset's batches, built in the workers, sent by a transport."""

from __future__ import annotations

import os

from torch.utils.data import IterableDataset, get_worker_info

from shardkit.loader import signals
from shardkit.loader.threads import cap_worker_threads
from shardkit.reader import spans


class BatchStream(IterableDataset):
    """Whole batches of a StreamingDataset for one loader; the dataset itself is left as given.

    Each worker (or the main process with num_workers=0) yields its share of the batches from
    the dataset's published position; with a transport, batch memory comes from the worker's
    shared slots and each batch is packed for the trip to the main process.
    """

    def __init__(self, dataset, batch_size: int, drop_last: bool, transport=None):
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.transport = transport
        self.main_pid = os.getpid()  # the training process: whose stop signals the workers defer to

    def set_epoch(self, epoch: int) -> None:
        """The dataset's set_epoch (for code that calls loader.dataset.set_epoch)."""
        self.dataset.set_epoch(epoch)

    def __iter__(self):
        # Not a generator: a DataLoader worker calls iter() when it takes up an iteration (at its
        # start and at each reset), once per iteration and in the order the main process started
        # them, so counting here tells the worker which iteration it serves. The first next()
        # comes later, possibly after the main process has stopped this iteration and begun the
        # next one.
        info = get_worker_info()
        if info is not None:  # a worker process: right after torch's set-up and worker_init_fn
            signals.take_in_worker(self.main_pid)
            if not getattr(self, "_capped", False):  # library threads: one per worker (loader/threads.py)
                self._capped = True
                cap_worker_threads()
        if self.transport is None:
            return spans.traced(self.dataset.batches(self.batch_size, self.drop_last), None, False, None)
        self.transport.start_iteration()
        # Traced (StarvationMeter(trace=...)), the pack is the batch's hand-off span and the spans
        # ride in the batch; off, this is the plain map of pack over the batches.
        return spans.traced(self.dataset.batches(self.batch_size, self.drop_last, self.transport),
                            self.transport.pack, info is not None, None if info is None else info.id)
