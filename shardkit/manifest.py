"""manifest.json: the versioned contract between the build and the readers (written last)."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field

from shardkit._version import __version__
from shardkit.errors import ConfigError, ManifestError
from shardkit.fs import RemoteError, atomic_write, join, read_bytes
from shardkit.contract import ShardInfo

FORMAT = "shardkit"
VERSION = 1
MANIFEST_NAME = "manifest.json"


def safe_relpath(path: str) -> str:
    """Reject paths that could leave the dataset folder: absolute, drive-letter, or with '..'."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"shard path {path!r} is not a non-empty string")
    p = path.replace("\\", "/")
    if p.startswith("/") or (len(p) > 1 and p[1] == ":") or "://" in p:
        raise ManifestError(f"shard path {path!r} is absolute; manifest paths must be relative to the dataset folder")
    if ".." in p.split("/") or posixpath.normpath(p).startswith(".."):
        raise ManifestError(f"shard path {path!r} leaves the dataset folder ('..' is not allowed in manifest paths)")
    return p


@dataclass
class Manifest:
    """The dataset: samples, field specs, classes, shards, and how it was built."""

    samples: int
    fields: dict
    shards: list[ShardInfo]
    classes: list[str] | None = None
    build: dict = field(default_factory=dict)
    errors: dict = field(default_factory=lambda: {"count": 0, "by_reason": {}})
    extra: dict = field(default_factory=dict)
    created_by: str = f"shardkit {__version__}"

    @property
    def formats(self) -> list[str]:
        return sorted({s.format for s in self.shards})

    def shards_of(self, fmt: str | None = None) -> list[ShardInfo]:
        """Shards of one format (default: parquet when present, else tar), ordered by id."""
        fmt = fmt or ("parquet" if "parquet" in self.formats else "tar")
        if not self.shards:
            raise ManifestError("this dataset is empty (0 samples, no shards): nothing to read; build it from a "
                                "folder with inputs")
        if fmt not in self.formats:
            raise ManifestError(f"this dataset has no {fmt!r} shards; it has {self.formats}")
        return sorted((s for s in self.shards if s.format == fmt), key=lambda s: s.id)

    def to_dict(self) -> dict:
        d = {
            "format": FORMAT,
            "version": VERSION,
            "created_by": self.created_by,
            "samples": self.samples,
            "fields": self.fields,
            "shards": [s.to_dict() for s in sorted(self.shards, key=lambda s: (s.id, s.format))],
            "build": self.build,
            "errors": self.errors,
        }
        if self.classes is not None:
            d["classes"] = self.classes
        d.update(self.extra)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict, where: str = "manifest") -> "Manifest":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ManifestError(f"{where} is not a shardkit manifest (expected \"format\": \"shardkit\")")
        if d.get("version") != VERSION:
            raise ManifestError(
                f"{where} has version {d.get('version')!r}; this shardkit ({__version__}) reads version "
                f"{VERSION}: upgrade shardkit or rebuild the dataset"
            )
        try:
            shards = [ShardInfo.from_dict(s) for s in d["shards"]]
            for s in shards:
                safe_relpath(s.path)
                if s.index:
                    safe_relpath(s.index["path"])
            known = {"format", "version", "created_by", "samples", "fields", "shards", "classes", "build", "errors"}
            check_counts(d["samples"], shards, where)
            return cls(samples=int(d["samples"]), fields=dict(d["fields"]), shards=shards,
                       classes=d.get("classes"), build=d.get("build", {}),
                       errors=d.get("errors", {"count": 0, "by_reason": {}}),
                       extra={k: v for k, v in d.items() if k not in known},
                       created_by=d.get("created_by", ""))
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{where} is malformed ({type(e).__name__}: {e}); rebuild the dataset") from e


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_counts(samples, shards: list[ShardInfo], where: str = "manifest") -> None:
    """Counts a reader can trust: every shard's samples and bytes a non-negative integer, and the
    shards of each format adding up to the dataset's samples (readers size epochs from these)."""
    if not _count(samples):
        raise ManifestError(f"{where}: samples={samples!r}; expected an integer >= 0: the manifest is damaged, "
                            "rebuild the dataset")
    for s in shards:
        for name in ("samples", "bytes"):
            if not _count(getattr(s, name)):
                raise ManifestError(f"{where}: shard {s.path} has {name}={getattr(s, name)!r}; expected an integer "
                                    ">= 0: the manifest is damaged, rebuild the dataset")
    for fmt in sorted({s.format for s in shards}):
        total = sum(s.samples for s in shards if s.format == fmt)
        if total != samples:
            raise ManifestError(f"{where}: its {fmt} shards hold {total} samples in all but it says samples={samples}: "
                                "the manifest is damaged, rebuild the dataset (`shardkit verify` checks each shard)")


def manifest_url(root: str) -> str:
    return join(root, MANIFEST_NAME)


def load_manifest(root: str, policy=None) -> Manifest:
    """Read and validate ROOT/manifest.json (a local folder, or an fsspec URL read with `policy`'s
    timeouts and retries: a shardkit.fs.RemotePolicy)."""
    url = manifest_url(root)
    try:
        raw = read_bytes(url, policy)
    except ConfigError as e:  # a remote backend that is not installed: the message names the extra
        raise ManifestError(str(e)) from e
    except (FileNotFoundError, RemoteError) as e:
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
    return Manifest.from_dict(d, where=url)


def shard_files(shards) -> set[str]:
    """Relative paths of every file the shards consist of (shard files and their index sidecars)."""
    return {s.path for s in shards} | {s.index["path"] for s in shards if s.index}


def remove_unlisted_shards(root: str, shards) -> None:
    """Delete ROOT/shards/data-* files that `shards` do not name (left by an earlier, larger run)."""
    import os

    keep, folder = shard_files(shards), os.path.join(root, "shards")
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith("data-") and f"shards/{name}" not in keep:
            os.remove(os.path.join(folder, name))


def write_manifest(root: str, manifest: Manifest) -> None:
    """Write ROOT/manifest.json atomically; call it only after every shard it names is in place."""
    atomic_write(manifest_url(root), manifest.to_json())
