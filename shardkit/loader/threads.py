"""Library threads in DataLoader workers: one each by default, so that W workers use W cores and
leave the rest to the training loop's thread (the one that launches the kernels).

torch already runs a worker's intra-op pool on one thread; numpy's BLAS, OpenMP and pyarrow's
CPU pool would each start a thread per core in every worker (15 workers x 16 threads on 16
cores). SHARDKIT_WORKER_THREADS=N caps them at N instead; "none" leaves the libraries' own
defaults (bench/gpu_bench.py's sweep compares the two).
"""

from __future__ import annotations

import os
import sys

ENV = "SHARDKIT_WORKER_THREADS"
LIBRARY_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def worker_threads() -> int | None:
    """The cap from SHARDKIT_WORKER_THREADS (default 1); None: "none", leave the libraries alone."""
    value = os.environ.get(ENV, "1").strip().lower()
    if value in ("none", "0", ""):
        return None
    try:
        return max(1, int(value))
    except ValueError:
        from shardkit.errors import ConfigError

        raise ConfigError(f"{ENV}={value!r}: expected a positive number of threads per worker, or 'none'") from None


def cap_worker_threads() -> int | None:
    """In a worker process: cap library threads (returns the cap, None when left alone). Environment
    variables for libraries loaded later (and processes they start), direct calls for those loaded."""
    cap = worker_threads()
    if cap is None:
        return None
    for name in LIBRARY_ENV:
        os.environ[name] = str(cap)
    import torch

    torch.set_num_threads(cap)
    pa = sys.modules.get("pyarrow")
    if pa is not None and hasattr(pa, "set_cpu_count"):
        pa.set_cpu_count(cap)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(cap)
    return cap
