"""manifest.json: the versioned contract between the build and the readers (written last)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from shardkit._version import __version__
from shardkit.contract import FIELD_KINDS, ShardInfo
from shardkit.errors import ConfigError, ManifestError
from shardkit.store.remote import RemoteError, read_bytes
from shardkit.store.local import join, sha256_bytes
from shardkit.manifest.table import ShardTable, safe_relpath

FORMAT = "shardkit"
VERSION = 2  # 2: the shard list may live only in the shard table; 1: always inline
MANIFEST_NAME = "manifest.json"
TABLE_NAME = "manifest.shards.parquet"
# Up to this many shard records stay inline in manifest.json too (version 1, which older
# shardkit reads); beyond it parsing them dominates start-up (100k inline: 2.2 s and a 292 MB
# peak, against 0.1 s and 172 MB from the table; bench/scale_bench.py), so the list lives only
# in the columnar table (version 2).
INLINE_SHARDS = 10_000


@dataclass
class Manifest:
    """The dataset: samples, field specs, classes, shards, and how it was built.

    `shards` is a ShardTable (a list of ShardInfo given here becomes one): it indexes and
    iterates like a list of ShardInfo.
    """

    samples: int
    fields: dict
    shards: ShardTable
    classes: list[str] | None = None
    build: dict = field(default_factory=dict)
    errors: dict = field(default_factory=lambda: {"count": 0, "by_reason": {}})
    extra: dict = field(default_factory=dict)
    created_by: str = f"shardkit {__version__}"

    def __post_init__(self):
        if not isinstance(self.shards, ShardTable):
            self.shards = ShardTable.from_infos(self.shards)

    @property
    def formats(self) -> list[str]:
        return self.shards.formats

    def shards_of(self, fmt: str | None = None) -> ShardTable:
        """Shards of one format (default: parquet when present, else tar), ordered by id."""
        fmt = fmt or ("parquet" if "parquet" in self.formats else "tar")
        if not len(self.shards):
            raise ManifestError("this dataset is empty (0 samples, no shards): nothing to read; build it from a "
                                "folder with inputs")
        if fmt not in self.formats:
            raise ManifestError(f"this dataset has no {fmt!r} shards; it has {self.formats}")
        return self.shards.of(fmt)

    def to_dict(self) -> dict:
        """manifest.json's content; the shard list is inline only when it is small (see INLINE_SHARDS)."""
        blob = self.shards.to_parquet()
        d = {
            "format": FORMAT,
            "version": 1 if len(self.shards) <= INLINE_SHARDS else VERSION,
            "created_by": self.created_by,
            "samples": self.samples,
            "fields": self.fields,
            "shard_table": {"path": TABLE_NAME, "rows": len(self.shards), "bytes": len(blob),
                            "sha256": sha256_bytes(blob)},
            "build": self.build,
            "errors": self.errors,
        }
        if d["version"] == 1:
            d["shards"] = [s.to_dict() for s in self.shards]
        if self.classes is not None:
            d["classes"] = self.classes
        d.update(self.extra)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict, where: str = "manifest", root: str | None = None, policy=None) -> "Manifest":
        """A manifest from manifest.json's content; `root` is where its shard table lies (version 2),
        read with `policy` (a shardkit.store.remote.RemotePolicy) when remote."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ManifestError(f"{where} is not a shardkit manifest (expected \"format\": \"shardkit\")")
        if d.get("version") not in (1, VERSION):
            raise ManifestError(
                f"{where} has version {d.get('version')!r}; this shardkit ({__version__}) reads versions "
                f"1 and {VERSION}: upgrade shardkit or rebuild the dataset"
            )
        try:
            shards = _inline_shards(d["shards"], where) if "shards" in d else _table(d["shard_table"], where, root, policy)
            known = {"format", "version", "created_by", "samples", "fields", "shards", "shard_table", "classes",
                     "build", "errors"}
            check_counts(d["samples"], shards, where)
            check_fields(d["fields"], where)
            return cls(samples=int(d["samples"]), fields=dict(d["fields"]), shards=shards,
                       classes=d.get("classes"), build=d.get("build", {}),
                       errors=d.get("errors", {"count": 0, "by_reason": {}}),
                       extra={k: v for k, v in d.items() if k not in known},
                       created_by=d.get("created_by", ""))
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{where} is malformed ({type(e).__name__}: {e}); rebuild the dataset") from e


def _inline_shards(records: list, where: str) -> ShardTable:
    shards = [ShardInfo.from_dict(s) for s in records]
    for s in shards:
        safe_relpath(s.path)
        if s.index:
            safe_relpath(s.index["path"])
        for name in ("samples", "bytes"):  # the table's int64 columns would not say which shard
            if not _count(getattr(s, name)):
                raise ManifestError(f"{where}: shard {s.path} has {name}={getattr(s, name)!r}; expected an integer "
                                    ">= 0: the manifest is damaged, rebuild the dataset")
    return ShardTable.from_infos(shards)


def _table(record: dict, where: str, root: str | None, policy=None) -> ShardTable:
    """The shard table a version-2 manifest names, checked against its size and sha256."""
    if root is None:
        raise ManifestError(f"{where} keeps its shards in {record.get('path')!r}: load it with load_manifest(ROOT)")
    url = join(root, safe_relpath(record["path"]))
    try:
        blob = read_bytes(url, policy)
    except ConfigError as e:  # a remote backend that is not installed: the message names the extra
        raise ManifestError(str(e)) from e
    except (OSError, RemoteError) as e:
        raise ManifestError(f"cannot read the shard table {url} ({getattr(e, 'detail', e)}); the dataset is "
                            "incomplete: copy the whole folder or rebuild it") from e
    if len(blob) != record["bytes"] or sha256_bytes(blob) != record["sha256"]:
        raise ManifestError(f"the shard table {url} does not match manifest.json (size or sha256): it was "
                            "replaced or damaged; rebuild the dataset")
    table = ShardTable(blob, url)
    if len(table) != record["rows"]:
        raise ManifestError(f"the shard table {url} has {len(table)} rows, manifest.json says {record['rows']}")
    return table


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_counts(samples, shards: ShardTable, where: str = "manifest") -> None:
    """Counts a reader can trust: every shard's samples and bytes an integer >= 0, and the shards of
    each format adding up to the dataset's samples (readers size epochs from these); checked over
    the table's columns."""
    import numpy as np

    if not _count(samples):
        raise ManifestError(f"{where}: samples={samples!r}; expected an integer >= 0: the manifest is damaged, "
                            "rebuild the dataset")
    for name, values in (("samples", shards.samples), ("bytes", shards.nbytes)):
        bad = np.nonzero(values < 0)[0]
        if len(bad):
            raise ManifestError(f"{where}: shard {shards[int(bad[0])].path} has {name}={int(values[bad[0]])}; "
                                "expected an integer >= 0: the manifest is damaged, rebuild the dataset")
    for fmt in shards.formats:
        total = int(shards.of(fmt).samples.sum())
        if total != samples:
            raise ManifestError(f"{where}: its {fmt} shards hold {total} samples in all but it says samples={samples}: "
                                "the manifest is damaged, rebuild the dataset (`shardkit verify` checks each shard)")


def check_fields(fields, where: str = "manifest") -> None:
    """Field specs a reader can trust: a known kind each, and a shape of positive ints and a numpy
    dtype where given. manifest.json has no checksum of its own, and a damaged spec would change
    how values decode (a raw image read as plain bytes) instead of failing."""
    import numpy as np

    if not isinstance(fields, dict):
        raise ManifestError(f"{where}: fields is {type(fields).__name__}, expected an object of field specs: "
                            "the manifest is damaged, rebuild the dataset")
    for name, spec in fields.items():
        kind = spec.get("kind") if isinstance(spec, dict) else None
        problem = None if kind in FIELD_KINDS else f"kind {kind!r}; expected one of {', '.join(FIELD_KINDS)}"
        shape = spec.get("shape") if problem is None else None
        if shape is not None and not (isinstance(shape, list) and all(_count(v) and v > 0 for v in shape)):
            problem = f"shape {shape!r}; expected a list of positive integers"
        if problem is None and spec.get("dtype") is not None:
            try:
                np.dtype(spec["dtype"])
            except TypeError:
                problem = f"dtype {spec['dtype']!r}; expected a numpy dtype name"
        if problem is not None:
            raise ManifestError(f"{where}: field {name!r} has {problem}: the manifest is damaged, rebuild the dataset")


def manifest_url(root: str) -> str:
    return join(root, MANIFEST_NAME)


def load_manifest(root: str, policy=None) -> Manifest:
    """Read and validate ROOT/manifest.json (a local folder, or an fsspec URL read with `policy`'s
    timeouts and retries: a shardkit.store.remote.RemotePolicy). A ROOT that is not a usable location (a
    malformed URL, an unknown protocol, a backend not installed) is a BadURL naming the fix."""
    from shardkit.errors import BadDatasetURL, BadURL
    from shardkit.store.urls import check_location

    try:
        root = check_location(root, "dataset")
    except BadURL as e:
        raise BadDatasetURL(str(e)) from None
    url = manifest_url(root)
    try:
        raw = read_bytes(url, policy)
    except ConfigError as e:  # a remote backend that is not installed: the message names the extra
        raise ManifestError(str(e)) from e
    except (FileNotFoundError, NotADirectoryError, RemoteError) as e:  # a file given as ROOT: not a directory
        if isinstance(e, RemoteError) and not e.not_found:
            raise ManifestError(f"cannot fetch {url}: {e.detail}") from e
        raise ManifestError(
            f"no manifest at {url}: is {root!r} a dataset built by `shardkit build`? "
            "(a build that did not finish writes no manifest; rerun it)"
        ) from e
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise ManifestError(f"{url} is not valid JSON ({e}); rebuild the dataset") from e
    return Manifest.from_dict(d, where=url, root=root, policy=policy)


def shard_files(shards) -> set[str]:
    """Relative paths of every file the shards consist of (shard files and their index sidecars)."""
    return {s.path for s in shards} | {s.index["path"] for s in shards if s.index}


def write_manifest(root: str, manifest: Manifest, policy=None) -> None:
    """Write ROOT/manifest.json atomically (a local folder, or a store: one PUT), after the shard table
    it checksums; call it only after every shard it names is in place."""
    from shardkit.store import write

    write(join(root, TABLE_NAME), manifest.shards.to_parquet(), policy)
    write(manifest_url(root), manifest.to_json(), policy)
