"""`shardkit dedup` on Dask: signatures per partition to files, then LSH + clusters + report, then the output dataset."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from dataclasses import asdict, dataclass

from shardkit.config import DedupConfig
from shardkit.errors import ConfigError, FailFast, RejectedInput, Rejection, count_by_reason
from shardkit.fs import folder_lock
from shardkit.stages.dedup import signatures as sigmod
from shardkit.stages.dedup.decide import cluster_stage
from shardkit.stages.dedup.report import DedupResult, write_report
from shardkit.tasks import dask_client, progress_bar, run_tasks

log = logging.getLogger("shardkit.dedup")
WORK_VERSION = 1


@dataclass(frozen=True)
class Partition:
    """A unit of signature work: items a reader turns into samples, and the file it writes."""

    index: int
    items: tuple
    path: str


class RecordReader:
    """Raw-folder records → samples (picklable, for Dask workers)."""

    def __init__(self, src: str, text_field: str):
        self.src, self.text_field = src, text_field

    def __call__(self, record):
        from shardkit.sources import read_record

        return [read_record(self.src, record, self.text_field)]

    @staticmethod
    def where(record) -> str:
        return record.source


class ShardReader:
    """Shards of a built dataset → samples with stored field values (picklable)."""

    def __init__(self, root: str, manifest):
        self.root, self.manifest = root, manifest

    def __call__(self, shard):
        from shardkit.reader.shards import read_shard_samples

        return read_shard_samples(self.root, self.manifest, shard)

    @staticmethod
    def where(shard) -> str:
        return shard.path


def _identity(item):
    """Items that already are samples."""
    return [item]


def _fingerprint(item) -> str:
    if hasattr(item, "fingerprint"):
        return item.fingerprint()
    if hasattr(item, "sha256"):
        return f"{item.path}|{item.sha256}"
    h = hashlib.sha256(item.key.encode())
    for name in sorted(item.fields):
        value = item.fields[name]
        h.update(name.encode() + (value if isinstance(value, bytes) else repr(value).encode("utf-8", "replace")))
    return h.hexdigest()


def signature_params(cfg: DedupConfig) -> sigmod.SignatureParams:
    return sigmod.SignatureParams(cfg.num_perm, cfg.seed, cfg.ngram, cfg.modality, cfg.image_hash, cfg.verify)


def plan_partitions(items: list, cfg: DedupConfig, workdir: str, per_partition: int | None = None) -> list[Partition]:
    """Fixed-size chunks of the (ordered) items; each file name carries a hash of inputs + parameters."""
    size = per_partition or cfg.partition_size
    params = repr((WORK_VERSION, asdict(signature_params(cfg)), cfg.text_field))
    parts = []
    for index, start in enumerate(range(0, len(items), size)):
        chunk = tuple(items[start:start + size])
        h = hashlib.sha256(params.encode())
        for item in chunk:
            h.update(_fingerprint(item).encode("utf-8", "surrogatepass"))
        parts.append(Partition(index, chunk, os.path.join(workdir, "signatures",
                                                          f"part-{index:05d}-{h.hexdigest()[:16]}.npz")))
    return parts


def signature_task(part: Partition, reader, params: sigmod.SignatureParams, specs: dict | None,
                   on_error: str) -> str:
    """The Dask task: read the partition's samples, compute signatures/hashes, save one file."""
    if os.path.exists(part.path):  # finished by an earlier run with the same inputs and parameters
        return part.path
    samples, rejections = [], []
    for item in part.items:
        try:
            samples.extend(reader(item))
        except RejectedInput as e:
            rejections.append(Rejection(getattr(reader, "where", str)(item), "read", e.reason))
    arrays, more = sigmod.compute(samples, params, specs)
    rejections += more
    if on_error == "fail" and rejections:
        raise FailFast(rejections[0])
    sigmod.save(part.path, arrays, rejections)
    return part.path


def signature_stage(parts: list[Partition], reader, cfg: DedupConfig, client=None, specs: dict | None = None) -> None:
    """Stage 1: one file per partition (skipping files already there); stale files are removed."""
    folder = os.path.dirname(parts[0].path) if parts else None
    if folder:
        os.makedirs(folder, exist_ok=True)
        wanted = {os.path.basename(p.path) for p in parts}
        for name in os.listdir(folder):
            if name.startswith("part-") and name not in wanted:
                os.remove(os.path.join(folder, name))
    todo = [p for p in parts if not os.path.exists(p.path)]
    log.info("dedup signatures: %d partitions, %d reused from an earlier run", len(parts), len(parts) - len(todo))
    with progress_bar(len(parts), initial=len(parts) - len(todo), desc="dedup signatures", unit="part",
                      enabled=cfg.progress) as bar:
        run_tasks(signature_task, todo, client=client, bar=bar, name="dedup-sig",
                  shared=(reader, signature_params(cfg), specs, cfg.on_error))


def find_duplicates(items, cfg: DedupConfig, client=None, workdir: str = ".", *, reader=None,
                    specs: dict | None = None, report_dir: str | None = None,
                    per_partition: int | None = None) -> DedupResult:
    """Find duplicates among `items` (Samples, or records/shards turned into Samples by `reader`).

    Writes signature files under WORKDIR/signatures (reused when inputs and parameters did not
    change), then clusters.parquet + summary.json under `report_dir` (default WORKDIR/report).
    `client=None` runs in this process. Used by `shardkit dedup` and `shardkit build --dedup`.
    """
    items = list(items)
    parts = plan_partitions(items, cfg, workdir, per_partition)
    signature_stage(parts, reader or _identity, cfg, client, specs)
    return cluster_stage([p.path for p in parts], cfg, report_dir or os.path.join(workdir, "report"))


def _filter_shard(task: tuple, root: str, manifest, out: str, removed: frozenset):
    """The Dask task of the output stage: one input shard minus the removed keys, same format."""
    shard, new_id = task
    from shardkit.reader.shards import read_shard_samples
    from shardkit.writers import get_writer

    kept = [s for s in read_shard_samples(root, manifest, shard) if s.key not in removed]
    return get_writer(shard.format)(kept, out, new_id, manifest.fields)


def shard_keys(root: str, manifest) -> dict[int, list[str]]:
    """Keys of each shard id, from the tar index sidecar or the Parquet key column (no media read)."""
    import pyarrow.parquet as pq

    from shardkit.fs import join, open_url

    out = {}
    for shard in manifest.shards_of():
        rel = shard.index["path"] if shard.format == "tar" else shard.path
        with open_url(join(root, rel)) as f:
            out[shard.id] = pq.read_table(f, columns=["__key__"]).column(0).to_pylist()
    return out


def _merge_errors(errors: dict, rejections: list[Rejection]) -> dict:
    by_reason = dict(errors.get("by_reason", {}))
    for k, v in count_by_reason(rejections).items():
        by_reason[k] = by_reason.get(k, 0) + v
    return {"count": errors.get("count", 0) + len(rejections), "by_reason": dict(sorted(by_reason.items()))}


def write_dataset(src: str, out: str, manifest, removed: frozenset, result: DedupResult, client=None,
                  progress: bool = True):
    """OUT as a dataset: the same shard formats, fields and classes, without the `removed` keys.

    Shards left empty are dropped and ids stay dense and in order; errors.jsonl = SRC's + ours.
    """
    from shardkit.fs import atomic_write, join, read_bytes
    from shardkit.manifest import Manifest, remove_unlisted_shards, write_manifest

    keys = shard_keys(src, manifest)
    survivors = [i for i in sorted(keys) if any(k not in removed for k in keys[i])]
    new_id = {old: new for new, old in enumerate(survivors)}
    tasks = [(s, new_id[s.id]) for s in manifest.shards if s.id in new_id]
    with progress_bar(len(tasks), desc="dedup write", unit="shard", enabled=progress) as bar:
        infos = run_tasks(_filter_shard, tasks, client=client, bar=bar, name="dedup-write",
                          shared=(src, manifest, out, removed))
    try:
        old_errors = read_bytes(join(src, "errors.jsonl")).decode("utf-8")
    except FileNotFoundError:
        old_errors = ""
    atomic_write(os.path.join(out, "errors.jsonl"), old_errors + "".join(r.to_json() + "\n" for r in result.rejections))
    fmt = "parquet" if "parquet" in manifest.formats else "tar"
    build = dict(manifest.build, dedup={"config": result.summary["parameters"], "source_samples": manifest.samples,
                                        "removed": len(result.removed), "report": "dedup/summary.json"})
    out_manifest = Manifest(samples=sum(i.samples for i in infos if i.format == fmt), fields=manifest.fields,
                            shards=infos, classes=manifest.classes, build=build,
                            errors=_merge_errors(manifest.errors, result.rejections), extra=dict(manifest.extra))
    write_manifest(out, out_manifest)
    remove_unlisted_shards(out, out_manifest.shards)
    return out_manifest


def _dedup_dataset(cfg: DedupConfig, manifest, workdir: str, client) -> tuple[DedupResult, object]:
    if manifest.fields.get("tokens", {}).get("layout") == "packed":
        raise ConfigError(f"{cfg.src} holds packed token rows (a --seq-len build): its documents are no longer "
                          "samples to compare; dedup the raw text instead: shardkit build RAW OUT --tokenizer ... "
                          "--seq-len ... --dedup")
    parts = plan_partitions(manifest.shards_of(), cfg, workdir, per_partition=1)
    signature_stage(parts, ShardReader(cfg.src, manifest), cfg, client, manifest.fields)
    result = cluster_stage([p.path for p in parts], cfg, None)
    removed = frozenset(result.removed_keys) | frozenset(result.rejected_keys)
    return result, write_dataset(cfg.src, cfg.out, manifest, removed, result, client, cfg.progress)


def dedup_records(records: list, src: str, out: str, cfg: DedupConfig, client=None) -> tuple[list, DedupResult]:
    """For `shardkit build --dedup`, between scanning and shard assignment: the records minus duplicates.

    Reads each record with sources.read_record (on `client` when given), writes signatures under
    OUT/.shardkit/dedup and the report to OUT/dedup/. Unreadable inputs are left in the returned
    records: the build rejects and records them itself.
    """
    parts = plan_partitions(records, cfg, os.path.join(out, ".shardkit", "dedup"))
    signature_stage(parts, RecordReader(src, cfg.text_field), cfg, client)
    result = cluster_stage([p.path for p in parts], cfg, os.path.join(out, "dedup"))
    removed = result.removed_keys
    return [r for r in records if r.key not in removed], result


def _dedup_raw(cfg: DedupConfig) -> tuple[DedupResult, object]:
    """Raw folder: `build --dedup` with all of cfg's options, in one pass (no staging copy)."""
    from shardkit.config import BuildConfig
    from shardkit.executor import build

    bcfg = BuildConfig(cfg.src, cfg.out, format=cfg.format, text_field=cfg.text_field, workers=cfg.workers,
                       scheduler=cfg.scheduler, on_error=cfg.on_error, progress=cfg.progress, dedup=True,
                       dedup_threshold=cfg.threshold, dedup_verify=cfg.verify, image_distance=cfg.image_distance)
    built = build(bcfg, dedup=cfg)
    result = built.dedup
    # Bad inputs are the build's to reject and record (errors.jsonl); ours would repeat them.
    result.rejections, result.rejected_keys = [], []
    result.inputs = built.inputs
    result.summary.update(inputs=built.inputs, rejected=len(built.rejections),
                          rejected_by_reason=built.rejected_by_reason)
    return result, built.manifest


def dedup(cfg: DedupConfig) -> DedupResult:
    """`shardkit dedup SRC OUT`: SRC a raw folder or a built dataset; OUT a dataset without the duplicates,
    with OUT/dedup/clusters.parquet and OUT/dedup/summary.json."""
    from dataclasses import replace

    cfg = replace(cfg, src=os.path.abspath(cfg.src), out=os.path.abspath(cfg.out))
    if cfg.src == cfg.out:
        raise ConfigError(f"OUT {cfg.out!r} is SRC: dedup writes a new dataset; choose another OUT folder")
    with folder_lock(cfg.out, "shardkit dedup"):  # one writer per OUT (a raw SRC's build takes it again)
        return _dedup(cfg)


def _dedup(cfg: DedupConfig) -> DedupResult:
    from shardkit.manifest import MANIFEST_NAME, load_manifest

    is_dataset = os.path.isfile(os.path.join(cfg.src, MANIFEST_NAME))
    if not is_dataset and not os.path.isdir(cfg.src):
        raise FileNotFoundError(f"SRC {cfg.src!r} is neither a dataset (manifest.json) nor a folder")
    if is_dataset:
        os.makedirs(os.path.join(cfg.out, "shards"), exist_ok=True)
        # Until this run ends, no manifest may name shards it is about to replace.
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(cfg.out, MANIFEST_NAME))
        with dask_client(cfg.scheduler, cfg.workers) as client:
            result, manifest = _dedup_dataset(cfg, load_manifest(cfg.src), os.path.join(cfg.out, ".shardkit", "dedup"),
                                              client)
    else:  # the build retires OUT's manifest itself and runs its own cluster
        result, manifest = _dedup_raw(cfg)
    result.summary["output"] = {"samples": manifest.samples, "shards": len(manifest.shards_of())}
    write_report(os.path.join(cfg.out, "dedup"), result.rows, result.summary)
    return result
