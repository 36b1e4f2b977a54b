"""Finding duplicates on Dask, for `shardkit dedup` and `shardkit build --dedup`.

Stage 1, one task per partition of the input: signatures, digests and image hashes to one file,
then the band entries for the current LSH parameters to another. Stage 2, one task per range of
the mixed-hash space: the entries of every partition in that range → exact, LSH and image links.
Then one union-find over the linked ids alone and the report rows of the clustered samples.
No process holds per-document state for the whole corpus: tasks hold their partition or their
hash range, the client holds the partition list, the links and the clustered rows.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import asdict, dataclass

import numpy as np

import shardkit.store as store
from shardkit.config import DedupConfig, remote_policy
from shardkit.contract import SOURCE_COLUMN, SOURCE_ROW_COLUMN
from shardkit.errors import FailFast, RejectedInput, Rejection
from shardkit.duplicates import signatures as sigmod
from shardkit.duplicates.decide import BucketParams, bucket_count, bucket_task, decide, merge_links
from shardkit.duplicates.partitions import PartitionRef, PartitionSet
from shardkit.duplicates.review import DedupResult, cluster_table, in_key_order, summarise
from shardkit.duplicates.store import ArrayFile, save_arrays
from shardkit.duplicates.text import SCHEME as TEXT_SCHEME
from shardkit.jobs.cluster import LazyClient
from shardkit.jobs.tasks import progress_bar, run_tasks

log = logging.getLogger("shardkit.dedup")
WORK_VERSION = 2


@dataclass(frozen=True)
class Partition:
    """A unit of signature work: items a reader turns into samples, and the file it writes."""

    index: int
    items: tuple
    path: str


class SampleReader:
    """Items that already are Samples."""

    def __call__(self, item):
        return [item]

    @staticmethod
    def key(item) -> str:
        return item.key


class PieceReader:
    """Pieces of a build's inventory → samples, read on the worker that signs them (picklable: it
    holds the build's SourceReader). The client sends a partition's pieces, never its rows."""

    def __init__(self, source):
        self.source = source

    def read_many(self, pieces):
        for (key, path, number), ref in zip(self.source.names(pieces), self.source.refs(pieces)):
            try:
                yield ref.make()
            except RejectedInput as e:
                yield sigmod.Unreadable(key, path, e.reason, number)


def shard_sources(root: str, shard, policy=None) -> tuple[list, list] | None:
    """The (source paths, lines/rows) a shard records for its samples, or None if it has none
    (`policy`: a job's RemotePolicy for a remote root)."""
    import pyarrow.parquet as pq

    from shardkit.store.local import join
    from shardkit.store.remote import open_url

    rel = shard.index["path"] if shard.format == "tar" and shard.index else shard.path
    with open_url(join(root, rel), policy=policy) as f:
        pf = pq.ParquetFile(f)
        if SOURCE_COLUMN not in pf.schema_arrow.names:
            return None
        t = pf.read(columns=[SOURCE_COLUMN, SOURCE_ROW_COLUMN])
    return t.column(0).to_pylist(), t.column(1).to_pylist()


class ShardReader:
    """Shards of a built dataset → samples with stored field values and recorded sources (picklable).
    A dataset without image fields gives each shard as one `StoredTexts` block instead: texts in
    bulk, no Sample per row."""

    def __init__(self, root: str, manifest, policy=None):
        self.root, self.manifest, self.policy = root, manifest, policy  # policy: the job's, for a remote root
        fields = manifest.fields
        self.texts_only = "txt" in fields and not set(sigmod.image_fields("auto", fields)) & set(fields)

    def __call__(self, shard):
        from shardkit.reader.shards import read_shard_columns, read_shard_samples

        recorded = shard_sources(self.root, shard, self.policy)
        if self.texts_only:
            keys, columns = read_shard_columns(self.root, self.manifest, shard, self.policy)
            paths, rows = recorded if recorded is not None else ([None] * len(keys), [None] * len(keys))
            # A row without a recorded source is named by the shard and its row in it.
            sources = [shard.path if p is None else p for p in paths]
            source_rows = [i if p is None else (-1 if r is None else r) for i, (p, r) in enumerate(zip(paths, rows))]
            return [sigmod.StoredTexts(keys, columns.get("txt", [None] * len(keys)), sources, source_rows)]
        samples = read_shard_samples(self.root, self.manifest, shard, self.policy)
        for row, s in enumerate(samples):
            if recorded is not None and recorded[0][row] is not None:
                s.meta.update(source_path=recorded[0][row], source_row=recorded[1][row])
            else:  # a dataset without recorded sources: name the shard and the row in it
                s.meta.update(source=shard.path, shard_row=row)
        return samples


def _fingerprint(item) -> str:
    if hasattr(item, "fingerprint"):
        return item.fingerprint()
    if hasattr(item, "sha256"):
        return f"{item.path}|{item.sha256}"
    h = hashlib.blake2b(item.key.encode("utf-8", "surrogatepass"), digest_size=16)
    for name in sorted(item.fields):
        value = item.fields[name]
        h.update(name.encode())
        h.update(value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
                 if isinstance(value, str) else repr(value).encode("utf-8", "replace"))
    return h.hexdigest()


def signature_params(cfg: DedupConfig) -> sigmod.SignatureParams:
    return sigmod.SignatureParams(cfg.num_perm, cfg.seed, cfg.ngram, cfg.modality, cfg.image_hash, cfg.verify,
                                  cfg.exact_only)


def _params(cfg: DedupConfig) -> str:
    """What a signature file depends on besides its inputs (the text hashing scheme included: files
    signed under another are never reused)."""
    return repr((WORK_VERSION, TEXT_SCHEME, asdict(signature_params(cfg)), cfg.text_field, cfg.image_field))


def plan_partitions(items, cfg: DedupConfig, workdir: str, per_partition: int | None = None) -> list[Partition]:
    """Fixed-size chunks of the (ordered) items; each file name carries a hash of inputs + parameters."""
    size = per_partition or cfg.partition_size
    params = _params(cfg)
    parts = []
    for index, start in enumerate(range(0, len(items), size)):
        chunk = tuple(items[start:start + size])
        h = hashlib.sha256(params.encode())
        for item in chunk:
            h.update(_fingerprint(item).encode("utf-8", "surrogatepass"))
        parts.append(Partition(index, chunk, os.path.join(workdir, "signatures",
                                                          f"part-{index:05d}-{h.hexdigest()[:16]}.bin")))
    return parts


def _band_path(sig_path: str, band: tuple) -> str:
    tag = hashlib.sha256(repr(band).encode()).hexdigest()[:8]
    folder = os.path.join(os.path.dirname(os.path.dirname(sig_path)), "bands")
    return os.path.join(folder, os.path.basename(sig_path)[:-4] + f"-{tag}.bin")


def _read(items, reader):
    """The samples of a partition's items, item by item (a shard's samples are let go once signed),
    an Unreadable row for each item the reader rejects."""
    if hasattr(reader, "read_many"):
        yield from reader.read_many(items)
        return
    for item in items:
        try:
            yield from reader(item)
        except RejectedInput as e:
            where = getattr(reader, "where", lambda it: (getattr(it, "path", str(it)), None))(item)
            yield sigmod.Unreadable(reader.key(item), where[0], e.reason, where[1])


def signature_task(part: Partition, reader, params: sigmod.SignatureParams, specs: dict | None,
                   on_error: str, band: tuple, policy=None) -> dict:
    """Stage 1 task: the partition's signature file (kept when an earlier run wrote it) and its
    entries for the bucket stage, `band` = ((bands, rows, image distance, min shingles), bucket
    tasks); returns the partition's meta. `policy`: the job's RemotePolicy, for files on a store."""
    if not store.exists(part.path, policy):
        arrays, meta = sigmod.compute(_read(part.items, reader), params, specs)
        if on_error == "fail" and meta["rejections"]:
            raise FailFast(Rejection(*meta["rejections"][0]))
        sigmod.save(part.path, arrays, meta, policy)
    sig = ArrayFile(part.path, policy)
    band_path = _band_path(part.path, band)
    if not store.exists(band_path, policy):
        save_arrays(band_path, *sigmod.band_entries(sig, *band), policy=policy)
    meta = dict(sig.meta, path=part.path, bands_path=band_path)
    meta["stats"] = dict(meta["stats"], **ArrayFile(band_path, policy).meta)
    return meta


def _remove_stale(folder: str, wanted: set[str], policy=None) -> None:
    for name in store.listdir(folder, policy):
        if name.startswith("part-") and name not in wanted:
            store.remove(store.join(folder, name), policy)


def signature_stage(parts: list[Partition], reader, cfg: DedupConfig, client=None,
                    specs: dict | None = None, tasks: int = 1) -> tuple[PartitionSet, list[dict]]:
    """Stage 1 on every partition (reusing files from an earlier run), its entries filed for `tasks`
    bucket tasks; stale files are removed."""
    band = ((*cfg.lsh_params(), cfg.image_distance, cfg.min_shingles()), tasks)
    policy = remote_policy(cfg)
    if parts:
        sig_dir = os.path.dirname(parts[0].path)  # posix path operations: also right for a URL
        store.makedirs(sig_dir)
        store.makedirs(os.path.dirname(_band_path(parts[0].path, band)))
        _remove_stale(sig_dir, {os.path.basename(p.path) for p in parts}, policy)
        _remove_stale(os.path.dirname(_band_path(parts[0].path, band)),
                      {os.path.basename(_band_path(p.path, band)) for p in parts}, policy)
    reused = sum(store.exists(p.path, policy) for p in parts)
    log.info("dedup signatures: %d partitions, %d reused from an earlier run", len(parts), reused)
    with progress_bar(len(parts), desc="dedup signatures", unit="part", enabled=cfg.progress) as bar:
        metas = run_tasks(signature_task, parts, client=client, bar=bar, name="dedup-sig",
                          shared=(reader, signature_params(cfg), specs, cfg.on_error, band, policy))
    refs, base = [], 0
    for m in metas:
        refs.append(PartitionRef(m["path"], m["bands_path"], base, m["stats"]["rows"]))
        base += m["stats"]["rows"]
    return PartitionSet(refs, policy), metas


def bucket_stage(parts: PartitionSet, cfg: DedupConfig, client=None, tasks: int = 1) -> tuple[np.ndarray, dict]:
    """Stage 2: one task per range of the mixed-hash space; their links merged once."""
    params = BucketParams(cfg.threshold, cfg.verify, cfg.image_distance)
    if isinstance(client, LazyClient):
        client = client.unless_few(tasks)
    with progress_bar(tasks, desc="dedup buckets", unit="range", enabled=cfg.progress) as bar:
        results = run_tasks(bucket_task, list(range(tasks)), client=client, bar=bar, name="dedup-bucket",
                            shared=(parts, params))
    links, stats = merge_links(results)
    stats["bucket_tasks"] = tasks
    return links, stats


def _rows(items: list) -> int:
    """Inputs the items hold: a dataset shard holds its samples, anything else is one."""
    return sum(getattr(item, "samples", 1) for item in items)


def find_duplicates(items, cfg: DedupConfig, client=None, workdir: str = ".", *, reader=None,
                    specs: dict | None = None, per_partition: int | None = None,
                    bucket_tasks: int | None = None) -> DedupResult:
    """Find duplicates among `items` (Samples, or records/shards turned into Samples by `reader`),
    in input order (the first of a cluster is kept: the smallest key when the input is sorted).

    Partition files go under WORKDIR (reused when inputs and parameters did not change).
    `client=None` runs every task in this process. The caller writes the report (`write_report`).
    """
    items = list(items)
    return _find(plan_partitions(items, cfg, workdir, per_partition), _rows(items), reader or SampleReader(), cfg,
                 client, specs, bucket_tasks)


def _find(parts: list[Partition], rows: int, reader, cfg: DedupConfig, client, specs: dict | None,
          bucket_tasks: int | None) -> DedupResult:
    """find_duplicates over planned partitions holding `rows` inputs in all."""
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return round(clock[-1] - clock[-2], 3)
    tasks = bucket_tasks or bucket_count(rows, cfg.lsh_params()[0])
    pset, metas = signature_stage(parts, reader, cfg, client, specs, tasks)
    seconds = {"signatures": lap()}
    links, link_stats = bucket_stage(pset, cfg, client, tasks)
    seconds["buckets"] = lap()
    nodes, labels = decide(links)
    table = cluster_table(pset, nodes, labels, verify=cfg.verify, key_order=in_key_order(metas))
    seconds["clusters"] = lap()
    rejections = sorted((Rejection(*r) for m in metas for r in m["rejections"]),
                        key=lambda r: (r.path, r.stage, r.reason))
    params = cfg.recorded()
    summary = summarise(metas, link_stats, table, params, rejections)
    summary["execution"] = {"signature_tasks": len(parts), "bucket_tasks": link_stats["bucket_tasks"], "seconds": seconds}
    removed = nodes[nodes != labels]
    rejected = _rejected_ids(pset, metas)
    return DedupResult(summary, table, removed, rejected, rejections)


def _rejected_ids(parts: PartitionSet, metas: list[dict]) -> np.ndarray:
    out = [np.empty(0, np.int64)]
    for i, ref in enumerate(parts.refs):
        if not metas[i]["stats"]["rejected"]:
            continue
        kind = parts.file(i)["kind"]
        out.append(np.flatnonzero(np.asarray(kind) == sigmod.MODALITY_CODES["rejected"]) + ref.base)
    return np.concatenate(out)


def dedup_inventory(inv, source, cfg: DedupConfig, client=None, workdir: str = ".") -> tuple[np.ndarray, DedupResult]:
    """The build's dedup step over its Inventory: (positions in key order of the samples to remove,
    DedupResult). Partitions are runs of the inventory's pieces (--partition-size samples each, cut
    as shards are: sources.plan), read and signed on the workers through `source` (the build's
    SourceReader), so this process holds one entry per partition and per row file, never one per
    row. Inputs dedup cannot read stay in: the build rejects and records them itself, once."""
    from shardkit.sources.plan import plan_shards

    params = _params(cfg)
    tag = hashlib.sha256(params.encode()).hexdigest()[:16]
    folder = os.path.join(workdir, "signatures")
    parts = []
    for plan in plan_shards(inv, 1 << 62, cfg.partition_size):
        h = hashlib.sha256(f"{params}|{plan.fingerprint(inv, tag)}".encode()).hexdigest()[:16]
        parts.append(Partition(plan.id, plan.pieces, os.path.join(folder, f"part-{plan.id:05d}-{h}.bin")))
    result = _find(parts, inv.samples, PieceReader(source), cfg, client, None, None)
    return result.removed_ids, result


def estimate_inventory_seconds(inv, encode: str = "keep") -> float:
    """Estimated single-process seconds to deduplicate and write a raw folder, from its Inventory's
    columns: file samples by their sizes, rows of row files by their byte lengths in the row index
    (memory-mapped; a tar holding images at the images' rate), no per-row object."""
    from shardkit.sources import walk as W
    from shardkit.sources.index import load_index
    from shardkit.sources.key_order import ATOMS

    image = text = 0
    if len(inv.atoms):
        kinds, row_file = inv.atoms.column("kinds").to_numpy(), inv.atoms.column("row_file").to_numpy()
        is_image = ((kinds & W.IMAGE) != 0) & (row_file < 0)
        image, text = int(inv.est[is_image].sum()), int(inv.est[~is_image].sum())
    for p in inv.pieces:
        if p.source != ATOMS:
            count = inv.counts[p.source]
            span = int(load_index(count, inv.opts.policy)["length"][p.start:p.stop].sum())
            if "image" in count.tar.get("kinds", ()):  # a tar of images: its samples' spans, as image bytes
                image += span
            else:
                text += span
    return image / IMAGE_BYTES_PER_SECOND["keep" if encode == "keep" else "encode"] + text / TEXT_BYTES_PER_SECOND


# Single-core throughput of a dedup run plus the build pass that follows it, by input kind, from
# bench/dedup_image_bench.py and bench/dedup_bench.py: what `plan_execution` weighs a cluster against.
IMAGE_BYTES_PER_SECOND = {"keep": 60e6, "encode": 12e6}  # original bytes kept / decoded and re-encoded
TEXT_BYTES_PER_SECOND = 4e6
