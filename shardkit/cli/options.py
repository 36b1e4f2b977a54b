"""Options that several commands take (build, dedup, annotate, bench), defined once so their names, the
parameter each binds, defaults and help agree."""

from __future__ import annotations

import click

from shardkit.config.common import FORMATS
from shardkit.errors import ON_ERROR_CHOICES


def workers_option(default: str = "one per core"):
    """--workers, bound as `workers`; `default`: what no value means for this command."""
    return click.option("--workers", "workers", type=int, default=None, metavar="N",
                        help=f"Dask workers of the embedded cluster; 0 runs in-process [default: {default}].")


def format_option(help: str):
    """--format of the shards a command writes, bound as `format`."""
    return click.option("--format", "format", type=click.Choice(FORMATS), default="tar", show_default=True,
                        help=help)


text_field_option = click.option(
    "--text-field", default="text", show_default=True,
    help="The text: a key of each .jsonl line, or a column of .parquet files.")
image_field_option = click.option(
    "--image-field", default="image", show_default=True,
    help="The image column of .parquet files: binary, or a struct {bytes, path} (Hugging Face datasets).")
scheduler_option = click.option(
    "--scheduler", default=None, metavar="ADDRESS",
    help="Use an existing Dask cluster, e.g. tcp://scheduler:8786: SRC and OUT as URLs of a store the workers "
         "reach (s3://, gs://, ...), or local paths of a disk they share under the same paths.")
timeout_option = click.option(
    "--timeout", type=float, default=15.0, show_default=True, metavar="SECONDS",
    help="SRC/OUT on a store: seconds to connect, and at most between two reads that return data.")
retries_option = click.option(
    "--retries", type=int, default=2, show_default=True,
    help="SRC/OUT on a store: more tries after a timeout, reset or HTTP 5xx/429 (backoff 1 s, 2 s, ...).")
on_error_option = click.option(
    "--on-error", type=click.Choice(ON_ERROR_CHOICES), default="skip", show_default=True,
    help="skip: record bad inputs in OUT/errors.jsonl, count them and go on; fail: stop at the first one.")
progress_option = click.option("--progress/--no-progress", default=True, show_default=True,
                               help="Show a progress bar on stderr.")
IMAGE_DISTANCE_HELP = (
    "Images whose hashes differ in at most this many of 64 bits are near duplicates. 10 sits above what "
    "resizing, JPEG quality 60 and a 2% crop move a pHash (p99 about 8 bits) and far below unrelated images "
    "(about 32 bits apart, rarely under 14). Search cost grows with it: distance+1 bands of 64/(distance+1) bits.")
image_distance_option = click.option("--image-distance", type=int, default=10, show_default=True,
                                     help=IMAGE_DISTANCE_HELP)
THRESHOLD_HELP = "Text: Jaccard similarity of the word n-gram sets at or above which two documents are duplicates."
VERIFY_HELP = ("Check candidate pairs with exact Jaccard of the shingle sets instead of the MinHash estimate: "
               "no false positives, no weak transitive links; stores shingle sets.")


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
