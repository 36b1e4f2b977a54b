"""shardkit: preprocess once, stream compact shards, drop near-duplicates, measure GPU starvation.

The public API is imported lazily so that `shardkit --help` does not pay for torch or Dask.
"""

from shardkit._version import __version__

__all__ = ["StreamingDataset", "Mixture", "Source", "make_loader", "StarvationMeter", "build", "dedup",
           "ShardWriter", "build_map", "__version__"]

_LAZY = {
    "StreamingDataset": ("shardkit.reader.dataset", "StreamingDataset"),
    "Mixture": ("shardkit.reader.mixture", "Mixture"),
    "Source": ("shardkit.reader.mixing", "Source"),
    "make_loader": ("shardkit.loader", "make_loader"),
    "StarvationMeter": ("shardkit.meter", "StarvationMeter"),
    "build": ("shardkit.jobs.build", "build"),
    "dedup": ("shardkit.jobs.dedup", "dedup"),
    "ShardWriter": ("shardkit.jobs.shard_writer", "ShardWriter"),
    "build_map": ("shardkit.jobs.map", "build_map"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardkit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
