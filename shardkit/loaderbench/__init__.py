"""The loader benchmark behind `shardkit bench`: raw folder vs WebDataset vs shardkit, measured in one run."""

from shardkit.loaderbench.settings import BenchConfig

__all__ = ["BenchConfig", "run_bench"]


def run_bench(cfg: BenchConfig) -> dict:
    """Prepare the variants (cached), measure them interleaved, write bench.json/.md/.png; return the report."""
    from shardkit.loaderbench.runner import run

    return run(cfg)
