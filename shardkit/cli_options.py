"""Options that `build` and `dedup` both take, defined once so their names, defaults and help agree."""

from __future__ import annotations

import click

text_field_option = click.option(
    "--text-field", default="text", show_default=True,
    help="The text: a key of each .jsonl line, or a column of .parquet files.")
image_field_option = click.option(
    "--image-field", default="image", show_default=True,
    help="The image column of .parquet files: binary, or a struct {bytes, path} (Hugging Face datasets).")
