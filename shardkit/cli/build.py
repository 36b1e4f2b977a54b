"""`shardkit build`: flags → BuildConfig → shardkit.jobs.build.build → a one-screen summary."""

from __future__ import annotations

import click

from shardkit.config import ENCODINGS, RESAMPLE_FILTERS, RESIZE_MODES, TAIL_CHOICES, WORKER_POOLS
from shardkit.config.common import BUILD_ENCODE, QUALITY, SHARD_SIZE
from shardkit.cli.curation import curation_lines, curation_options
from shardkit.cli.options import (THRESHOLD_HELP, VERIFY_HELP, human_bytes, image_distance_option, image_field_option,
                                  on_error_option, progress_option, retries_option, scheduler_option,
                                  text_field_option, timeout_option, format_option, workers_option)


def _parse_size(ctx, param, value):
    from shardkit.config import parse_bytes

    try:
        return parse_bytes(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command()
@click.argument("src")
@click.argument("out")
@format_option("Shard format: WebDataset tar, Parquet, or both (same samples in each).")
@click.option("--shard-size", default=f"{SHARD_SIZE // 10**6}MB", show_default=True, callback=_parse_size,
              help="Target bytes per shard (e.g. 64MB, 1GiB); cut from estimated output sizes.")
@click.option("--max-samples-per-shard", type=int, default=10_000, show_default=True)
@click.option("--image-size", type=int, default=None, help="Target size in pixels (see --resize-mode).")
@click.option("--resize-mode", type=click.Choice(RESIZE_MODES), default="shorter", show_default=True,
              help="shorter: shorter side → N; center-crop: then crop N×N; pad: longer side → N, pad to N×N.")
@click.option("--crop-size", type=int, default=None, metavar="C",
              help="Then keep the centre C×C (C <= N): --image-size 256 --crop-size 224 is the usual "
                   "'shorter side 256, center crop 224'.")
@click.option("--resample", type=click.Choice(RESAMPLE_FILTERS), default="bicubic", show_default=True,
              help="Resampling filter of the resize (PIL's).")
@click.option("--encode", type=click.Choice(ENCODINGS), default=BUILD_ENCODE, show_default=True,
              help="Image encoding; raw = uint8 H×W×3 arrays, no decode when training (needs a fixed size); "
                   "keep = each input's own bytes, field named by its extension (no resize).")
@click.option("--quality", type=int, default=QUALITY, show_default=True, help="JPEG/WebP quality 1-100.")
@click.option("--labels/--no-labels", default=None,
              help="Label each sample by its first-level subfolder (field cls, class list in the manifest) "
                   "[default: when SRC has class subfolders: two or more, or one holding all the images].")
@text_field_option
@image_field_option
@click.option("--label-field", default=None, metavar="COLUMN",
              help="Label .parquet rows by this column (integers, or strings → class list) instead of by folder.")
@workers_option()
@click.option("--worker-pool", type=click.Choice(WORKER_POOLS), default="auto", show_default=True,
              help="How embedded workers run: threads of this process (images: Pillow releases the GIL, and "
                   "nothing is copied between processes) or processes; auto: for a folder of images, threads "
                   "where a ~0.25 s probe finds their GIL cap above what the cores do, else processes "
                   "(`shardkit --debug build ...` says which and why).")
@scheduler_option
@timeout_option
@retries_option
@click.option("--unit-samples", type=int, default=None, metavar="N",
              help="Samples per work unit [default: chosen from the worker count so every worker stays busy]; "
                   "never changes the output.")
@on_error_option
@progress_option
@click.option("--dedup", is_flag=True, help="Remove near-duplicates (MinHash LSH for text, pHash for images) "
              "before writing; report in OUT/dedup/. Tune with --dedup-threshold/--dedup-verify/--image-distance.")
@click.option("--dedup-threshold", type=float, default=0.8, show_default=True, help=THRESHOLD_HELP)
@click.option("--dedup-verify", is_flag=True, help=VERIFY_HELP)
@image_distance_option
@click.option("--tokenizer", default=None, metavar="FILE|bpe:N",
              help="Tokenize text once at build time (field tokens replaces txt): a tokenizer.json file, or "
                   "bpe:N to train an N-token byte-level BPE on the corpus first. Saved as OUT/tokenizer.json; "
                   "never downloaded from a hub.")
@click.option("--eos-token", default=None, metavar="TOKEN",
              help="Id appended after each document [default: the tokenizer's <|endoftext|>, </s>, <eos> …].")
@click.option("--seq-len", type=int, default=None, metavar="N",
              help="Pack documents into rows of N+1 ids (consecutive rows share one id: inputs = row[:-1], "
                   "targets = row[1:]); document offsets stored with the rows (field doc_offsets). Without it: "
                   "one row per document.")
@click.option("--tail", type=click.Choice(TAIL_CHOICES), default="pad", show_default=True,
              help="Each shard's last partial packed row: pad it (pad id = dtype max) or drop it (counted in "
                   "the manifest's tokenizer stats).")
@click.option("--augment", type=int, default=0, show_default=True, metavar="K",
              help="Store K augmented variants per image (fields jpg, 1.jpg … K-1.jpg); the reader shows "
                   "variant (epoch + hash(key)) mod K, so each epoch sees another one.")
@click.option("--augment-ops", default="crop,flip,color", show_default=True,
              help="Comma list, applied in this order: crop = random resized crop (area 35-100%, aspect 3/4-4/3, "
                   "back to the same size); flip = horizontal, p=0.5; rotate = uniform ±15°; color = "
                   "brightness/contrast/saturation ×0.6-1.4; blur = Gaussian radius 0.1-2.0, p=0.5.")
@click.option("--augment-keep-original", is_flag=True, help="Variant 0 is the unaugmented image.")
@click.option("--augment-seed", type=int, default=0, show_default=True,
              help="Variant k of a sample is seeded by (seed, key, k): the same bytes on every build.")
@click.option("--half", is_flag=True, help="Store float .npy arrays (field array) as float16: half the bytes.")
@curation_options
@click.option("--allow-empty", is_flag=True, help="Write an empty dataset when SRC holds no sample (else an error).")
@click.option("--map", "map", default=None, metavar="MODULE:FUNCTION",
              help="Run your function on each sample after the built-in stages: it gets a sample dict "
                   "(__key__, encoded image bytes, cls, txt, json, numpy arrays) and returns one, a list, or None "
                   "to drop it; a sample whose function raises goes to errors.jsonl. Same bytes for any --workers.")
@click.option("--annotate", is_flag=True,
              help="Keep every sample and store the scores of --filter and --lang (and --dedup's clusters) in attribute "
                   "tables beside the shards; choose at training time: StreamingDataset(OUT, where=...).")
def build(src, out, **options):
    """Turn a raw folder SRC into shards + manifest in OUT (each a local folder or a URL: s3://, gs://, ...).

    \b
    SRC conventions: files sharing a stem are one sample (cats/001.jpg + cats/001.json);
    the first-level subfolder is the label; .txt/.md are text; each .jsonl line and each
    .parquet row is a sample; a WebDataset .tar is read as the folder it extracts to (its
    cls members are the labels). Rerunning skips shards whose inputs and options did not change.

    \b
    Examples:
      shardkit build raw/ out/ --image-size 256
      shardkit build raw/ out/ --image-size 256 --crop-size 224 --resample bilinear --encode raw
      shardkit build raw/ out/ --image-size 224 --resize-mode center-crop --encode raw --format both
      shardkit build raw/ out/ --scheduler tcp://scheduler:8786 --on-error fail
      shardkit build s3://bucket/raw s3://bucket/shards --scheduler tcp://scheduler:8786
      shardkit build corpus/ out/ --tokenizer bpe:32000 --seq-len 2048 --format parquet
      shardkit build hf_export/ out/ --image-field image --label-field label --image-size 224
      shardkit build laion_tars/ out/ --image-size 224 --dedup   (WebDataset: resized, deduplicated, re-sharded)
      shardkit build raw/ out/ --image-size 224 --resize-mode center-crop --augment 4 --augment-ops crop,flip,color
      shardkit build features/ out/ --half
      shardkit build raw/ out/ --image-size 256 --map my_pipeline:add_caption   (my_pipeline.py on PYTHONPATH)
      shardkit build corpus/ out/ --filter text-length --dedup --annotate   (then where="text_length and not duplicate")
      shardkit build crawl/ out/ --filter gopher-quality,gopher-repetition,c4,fineweb --lang en --dedup-exact
    """
    from shardkit.config import BuildConfig
    from shardkit.jobs.build import build as run_build

    # Every flag is named after its BuildConfig field: the mapping is one-to-one by construction.
    cfg = BuildConfig(src=src, out=out, **options)
    if cfg.map:  # the built-in stages into a staging dataset, then the function over its samples
        from shardkit.jobs.map.mapped_build import build_with_map, map_summary

        click.echo(map_summary(build_with_map(cfg)))
        return
    result = run_build(cfg)
    click.echo(build_summary(result))


def build_summary(r) -> str:
    """The one-screen summary of a build."""
    total_bytes = sum(s.bytes for s in r.shards)
    per_format = sorted({s.format for s in r.shards})
    n_shards = len({s.id for s in r.shards})
    lines = [
        f"built {r.out}",
        f"  inputs          {r.inputs}",
        f"  samples written {r.samples}",
        f"  rejected        {len(r.rejections)}" + (" (see errors.jsonl)" if r.rejections else ""),
    ]
    lines += [f"    {n:>5}  {reason}" for reason, n in r.rejected_by_reason.items()]
    lines += [f"  note            {note}" for note in r.notes]
    lines += _dedup_lines(r)
    lines += curation_lines(getattr(r, "stats", {}))
    if r.utf8_replaced:
        lines.append(f"  text            {r.utf8_replaced} invalid UTF-8 characters replaced")
    tok = r.manifest.extra.get("tokenizer") if r.manifest else None
    lines += _content_lines(r, tok)
    lines += [
        f"  shards          {n_shards} × {'+'.join(per_format) or '-'}"
        + (f" ({r.reused_shards} unchanged, reused)" if r.reused_shards else ""),
        f"  bytes           {human_bytes(total_bytes)}",
        f"  time            {r.seconds:.1f} s",
        _rate_line(r, tok),
    ]
    return "\n".join(line for line in lines if line)


def _dedup_lines(r) -> list[str]:
    """The summary's lines on duplicates removed or marked, and on the attribute columns written."""
    lines = []
    if r.duplicates:
        lines.append(f"  duplicates      {r.duplicates} removed (review dedup/clusters.parquet, dedup/summary.json)")
    marked = r.manifest.build.get("dedup", {}).get("marked") if r.manifest else None
    if marked:
        lines.append(f"  duplicates      {marked} marked, kept (attribute duplicate; review dedup/clusters.parquet)")
    attributes = r.manifest.extra.get("attributes") if r.manifest else None
    if attributes:
        lines.append(f"  attributes      {', '.join(attributes['columns'])} (train on a subset: "
                     "StreamingDataset(OUT, where=...))")
    if getattr(r, "exact_duplicates", 0):
        lines.append(f"  exact dups      {r.exact_duplicates} removed (review dedup/exact/clusters.parquet)")
    return lines


def _content_lines(r, tok: dict | None) -> list[str]:
    """The summary's lines on what the rows hold: tokens (with the tokenizer's stats) and labels."""
    lines = []
    if tok:
        st = tok.get("stats", {})
        lines.append(f"  tokens          {st.get('tokens', 0)} from {st.get('documents', 0)} documents in "
                     f"{st.get('rows', 0)} rows ({st.get('pad_tokens', 0)} padding, {st.get('dropped_tokens', 0)} "
                     f"dropped); tokenizer {tok['source']} → tokenizer.json")
    classes = r.manifest.classes if r.manifest else None
    column = r.manifest.build.get("config", {}).get("label_field") if classes else None
    if column:
        lines.append(f"  labels          {len(classes)} classes from column {column!r} (--label-field)")
    elif classes:
        lines.append(f"  labels          {len(classes)} classes from the subfolders (--no-labels to leave them out)")
    return lines


def _rate_line(r, tok: dict | None) -> str:
    """The build's throughput in what it processed: images, else tokens, else samples."""
    if r.seconds <= 0:
        return ""
    if r.images:
        return f"  images/s        {r.images / r.seconds:,.0f}"
    if tok:
        st = tok.get("stats", {})
        return (f"  documents/s     {st.get('documents', 0) / r.seconds:,.0f} "
                f"({st.get('tokens', 0) / r.seconds:,.0f} tokens/s)")
    return f"  samples/s       {r.samples / r.seconds:,.0f}"
