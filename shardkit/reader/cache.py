"""Remote shards: fetch through fsspec into a local cache (locked, checksummed, LRU-evicted)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile

from shardkit.errors import ShardError
from shardkit.fs import is_remote, join, local_path, remote_hint, tmp_name
from shardkit.contract import ShardInfo

CHUNK = 1 << 20


def default_cache_dir() -> str:
    """$SHARDKIT_CACHE, else a shardkit-cache folder in the system temp dir."""
    return os.environ.get("SHARDKIT_CACHE") or os.path.join(tempfile.gettempdir(), "shardkit-cache")


def download(url: str, dest: str, sha256: str, nbytes: int | None) -> None:
    """Copy `url` to `dest` (temp + rename) after checking its sha256 and size against the manifest."""
    import fsspec

    tmp = tmp_name(dest)
    h, n = hashlib.sha256(), 0
    try:
        with fsspec.open(url, "rb") as src, open(tmp, "wb") as out:
            while block := src.read(CHUNK):
                h.update(block)
                n += len(block)
                out.write(block)
    except Exception as e:  # any fsspec/network error: name the shard and the cause
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise ShardError(f"cannot fetch shard {url}: {type(e).__name__}: {e}{remote_hint(url, e)}") from e
    if h.hexdigest() != sha256 or (nbytes is not None and n != nbytes):
        os.remove(tmp)
        raise ShardError(f"checksum mismatch for shard {url}: got sha256 {h.hexdigest()[:16]}… ({n} bytes), "
                         f"the manifest says {sha256[:16]}… ({nbytes} bytes); the remote copy is corrupt or "
                         "changed since the build: rebuild or re-upload the dataset")
    os.replace(tmp, dest)


class ShardCache:
    """Local paths for shard files: the file itself when local, a verified cached copy when remote.

    Concurrent workers serialise on a per-file lock, so each file is fetched once; the copy
    appears under its final name only after its checksum passed, so existence means verified.
    """

    def __init__(self, root: str, cache_dir: str | None = None, cache_limit: int | None = None):
        self.root, self.remote, self.limit = str(root), is_remote(root), cache_limit
        self.dir = None
        if self.remote:
            tag = hashlib.sha256(self.root.encode()).hexdigest()[:16]
            self.dir = os.path.join(cache_dir or default_cache_dir(), tag)
        self.fetched = 0

    def path(self, rel: str, sha256: str, nbytes: int | None = None, *, evict: bool = True) -> str:
        """A local path holding the file `rel` of the dataset (fetched and checked if remote)."""
        if not self.remote:
            return join(local_path(self.root), rel)
        dest = os.path.join(self.dir, rel)
        if os.path.exists(dest):
            with contextlib.suppress(FileNotFoundError):
                os.utime(dest)  # mtime is the LRU clock
                return dest
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not os.path.exists(dest):
                    download(join(self.root, rel), dest, sha256, nbytes)
                    self.fetched += 1
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        if evict:
            self.evict(keep={dest})
        return dest

    def shard_paths(self, shard: ShardInfo) -> tuple[str, str | None]:
        """(shard path, index sidecar path or None), both local."""
        index = None
        if shard.index:
            index = self.path(shard.index["path"], shard.index["sha256"], shard.index.get("bytes"), evict=False)
        path = self.path(shard.path, shard.sha256, shard.bytes, evict=False)
        self.evict(keep={path, index})
        return path, index

    def evict(self, keep: set) -> int:
        """Delete least recently used copies until the cache fits `cache_limit`; returns bytes freed."""
        if self.limit is None or not self.remote:
            return 0
        files = []
        for dirpath, _, names in os.walk(self.dir):
            for name in names:
                if name.endswith(".lock") or ".tmp-" in name:
                    continue
                p = os.path.join(dirpath, name)
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(p)
                    files.append((st.st_mtime_ns, st.st_size, p))
        total, freed = sum(f[1] for f in files), 0
        for _, size, p in sorted(files):
            if total - freed <= self.limit:
                break
            if p in keep:
                continue
            # A reader that already opened (or mapped) the file keeps its data: unlink is safe.
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)
                freed += size
        return freed


@contextlib.contextmanager
def fetch_to_temp(root: str, shard: ShardInfo):
    """Fetch one remote shard (and its index) into a temp folder, checked; removed on exit."""
    tmp = tempfile.mkdtemp(prefix="shardkit-fetch-")
    try:
        cache = ShardCache(root, cache_dir=tmp)
        yield cache.shard_paths(shard)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
