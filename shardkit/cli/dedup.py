"""`shardkit dedup`: flags → DedupConfig → shardkit.jobs.dedup.dedup → a one-screen summary."""

from __future__ import annotations

import click

from shardkit.config import DEDUP_MODALITIES, IMAGE_HASHES
from shardkit.cli.curation import curation_lines, curation_options
from shardkit.cli.options import (THRESHOLD_HELP, VERIFY_HELP, image_distance_option, image_field_option,
                                  on_error_option, progress_option, retries_option, scheduler_option,
                                  text_field_option, timeout_option, format_option, workers_option)


@click.command()
@click.argument("src")
@click.argument("out")
@click.option("--threshold", type=float, default=0.8, show_default=True, help=THRESHOLD_HELP)
@click.option("--ngram", type=int, default=5, show_default=True,
              help="Words per shingle (documents shorter than this are one shingle).")
@click.option("--num-perm", type=int, default=128, show_default=True,
              help="MinHash permutations: signature bytes/doc = 4 x this; more = sharper estimates.")
@click.option("--bands", type=int, default=None,
              help="LSH bands (with --rows) [default: datasketch's optimal pair for --threshold, weighted 9:1 "
                   "toward recall since every candidate is checked against the threshold afterwards].")
@click.option("--rows", type=int, default=None, help="LSH rows per band (with --bands).")
@click.option("--verify/--no-verify", default=False, show_default=True, help=VERIFY_HELP)
@click.option("--seed", type=int, default=1, show_default=True, help="MinHash permutation seed (datasketch's).")
@click.option("--modality", type=click.Choice(DEDUP_MODALITIES), default="auto", show_default=True,
              help="auto: samples with an image compare by image, others by their text.")
@click.option("--image-hash", type=click.Choice(IMAGE_HASHES), default="phash", show_default=True,
              help="64-bit perceptual hash of a grey thumbnail: phash (DCT signs; fewer false matches on "
                   "smooth images) or dhash (neighbour gradients; faster).")
@image_distance_option
@click.option("--partition-size", type=int, default=5000, show_default=True,
              help="Samples per signature task (a built dataset's shards are grouped whole, at least one "
                   "per task). Every bucket task reads a slice of each partition: at 100M+ samples use "
                   "100000 or more.")
@format_option("Shard format when SRC is a raw folder (its images are stored byte for byte, under their own "
               "extension); a built dataset keeps its formats.")
@text_field_option
@image_field_option
@workers_option("in-process when the estimated work cannot pay for starting a cluster, else one per core")
@scheduler_option
@timeout_option
@retries_option
@on_error_option
@progress_option
@curation_options
def dedup(src, out, threshold, ngram, num_perm, bands, rows, verify, seed, modality, image_hash, image_distance,
          partition_size, format, text_field, image_field, workers, scheduler, timeout, retries, on_error, progress,
          **curation):
    """Drop exact and near-duplicate samples of SRC (a raw folder or a built dataset) into a new dataset OUT.

    \b
    Text: NFKC + lowercase + punctuation folded, word n-gram shingles, MinHash (datasketch-compatible
    signatures: datasketch.LeanMinHash(seed=, hashvalues=, scheme="affine32")), LSH banding.
    Images: exact by identical bytes, near by a 64-bit perceptual hash (from a reduced decode: JPEG at 1/8
    scale) within --image-distance bits.
    Exact duplicates (same normalised text, same image bytes) are linked too; clusters are connected
    components; the smallest key is kept. Texts with too few distinct shingles to compare (a few
    words, ASCII art) are compared for exact equality only. Kept data is never changed: a raw
    folder's images are stored with their own bytes and extension (to resize or re-encode while
    deduplicating: shardkit build RAW OUT --dedup --image-size 224 ...). Review what was removed,
    with each sample's source file and line, in OUT/dedup/clusters.parquet and OUT/dedup/summary.json.

    \b
    Examples:
      shardkit dedup data/ data-dedup/                        # a dataset built by `shardkit build`
      shardkit dedup raw/ out/ --format parquet               # a raw folder: build without duplicates
      shardkit dedup laion_tars/ out/                          # WebDataset tars: images keep their bytes
      shardkit dedup data/ out/ --threshold 0.7 --verify      # looser, with exact Jaccard checks
      shardkit dedup data/ out/ --modality image --image-distance 6
      shardkit dedup data/ out/ --scheduler tcp://scheduler:8786
      shardkit dedup s3://bucket/raw s3://bucket/dedup --scheduler tcp://scheduler:8786
      shardkit dedup crawl/ out/ --filter gopher-quality,c4 --lang en --dedup-exact   # a raw folder, curated
      shardkit dedup data/ out/ --filter gopher-quality,c4 --lang en --mask-pii      # a built dataset, curated
    """
    from shardkit.config import DedupConfig
    from shardkit.jobs.dedup import dedup as run_dedup

    cfg = DedupConfig(src=src, out=out, threshold=threshold, num_perm=num_perm, ngram=ngram, bands=bands,
                      rows=rows, seed=seed, verify=verify, modality=modality, image_hash=image_hash,
                      image_distance=image_distance, partition_size=partition_size, format=format,
                      text_field=text_field, image_field=image_field, workers=workers, scheduler=scheduler,
                      on_error=on_error, progress=progress, timeout=timeout, retries=retries, curation=curation)
    _say_result(run_dedup(cfg), out, curation)


def _say_result(result, out, curation: dict) -> None:
    """Prints what a dedup did: its summary, what the curation filters removed, and where OUT is."""
    from shardkit.duplicates.review import summary_text

    click.echo(summary_text(result))
    if any(v for k, v in curation.items() if k != "lang_threshold"):  # what the filters removed, as build says it
        from shardkit.manifest import load_manifest

        for line in curation_lines(load_manifest(out).build.get("curation", {}).get("counts", {})):
            click.echo(line)
    click.echo(f"  wrote {out}: {result.summary['output']['samples']} samples in "
               f"{result.summary['output']['shards']} shards; review {out}/dedup/clusters.parquet")
