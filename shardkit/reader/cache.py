"""Remote shards: fetch through fsspec into a local cache that processes share (pinned, checksummed,
LRU-evicted).

Each cached file `F` has a lock file `F.lock`. A reader holds a shared flock on it for as long as
it has the file open (a pin); the fetcher holds it exclusively while it downloads; an evictor
deletes `F` only after taking it exclusively without waiting, so it never deletes a file that a
process is fetching, opening or reading. The kernel drops a dead process's flocks, so a killed
reader or fetcher leaves nothing stuck.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
import time

from shardkit.contract import ShardInfo
from shardkit.errors import ShardError
from shardkit.fs import RemotePolicy, RemoteError, filesystem, is_remote, join, local_path, tmp_name, with_retries

CHUNK = 1 << 20
LOCK = ".lock"
EVICTOR_LOCK = ".evictor.lock"  # one evictor at a time per cache folder
TMP = ".tmp-"
ATTEMPTS = 3  # pin tries when evictors keep removing a freshly fetched file (cache far too small)


def default_cache_dir() -> str:
    """$SHARDKIT_CACHE, else a shardkit-cache folder in the system temp dir."""
    return os.environ.get("SHARDKIT_CACHE") or os.path.join(tempfile.gettempdir(), "shardkit-cache")


def _fetch_once(fs, path: str, tmp: str, nbytes: int | None) -> str:
    """One try: stream the file into tmp (rewritten from the start); returns its sha256."""
    h = hashlib.sha256()
    # http(s): one streamed GET; its size comes from the manifest, not from a HEAD request.
    options = {"block_size": 0, "size": nbytes} if path.startswith(("http://", "https://")) and nbytes else {}
    with fs.open(path, "rb", **options) as src, open(tmp, "wb") as out:
        while block := src.read(CHUNK):
            h.update(block)
            out.write(block)
    return h.hexdigest()


def download(url: str, dest: str, sha256: str, nbytes: int | None, policy: RemotePolicy | None = None) -> None:
    """Copy `url` to `dest` (temp + rename) after checking its sha256 and size against the manifest."""
    policy = policy or RemotePolicy()
    fs, path = filesystem(url, policy)
    tmp = tmp_name(dest)
    try:
        digest = with_retries(url, policy, lambda: _fetch_once(fs, path, tmp, nbytes))
    except RemoteError as e:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise ShardError(f"cannot fetch shard {url}: {e.detail}") from e
    n = os.path.getsize(tmp)
    if digest != sha256 or (nbytes is not None and n != nbytes):
        os.remove(tmp)
        raise ShardError(f"checksum mismatch for shard {url}: got sha256 {digest[:16]}… ({n} bytes), "
                         f"the manifest says {sha256[:16]}… ({nbytes} bytes); the remote copy is corrupt or "
                         "changed since the build: rebuild or re-upload the dataset")
    os.replace(tmp, dest)


def _flock(path: str, mode: int) -> int | None:
    """An fd of `path` (created if missing) flocked in `mode`; None when LOCK_NB and it is taken.

    An evictor deletes lock files it holds, so after waiting, check that the locked file is
    still the one at `path`; if not, lock the new one.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


class Pin:
    """A shared flock on a cached file: while held, no evictor deletes the file. release() is idempotent."""

    def __init__(self, fd: int | None = None):
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the fd drops its flock
            self.fd = None

    __del__ = release  # a reader dropped without closing (a discarded dataset) unpins its files too


class PinnedShard:
    """Local paths of a shard and its index sidecar, pinned until released."""

    def __init__(self, path: str, index: str | None, pins: tuple[Pin, Pin]):
        self.path, self.index, self._pins = path, index, pins

    def release_index(self) -> None:
        """The index is read whole when the shard opens: after that it may go."""
        self._pins[1].release()

    def release(self) -> None:
        for pin in self._pins:
            pin.release()


class ShardCache:
    """Local paths for shard files: the file itself when local, a verified cached copy when remote.

    A cached copy appears under its final name only after its checksum passed, so existence
    means verified. `cache_limit` bounds the bytes in this dataset's cache folder, plus the
    files that readers have pinned at that moment (each DataLoader worker pins the shards of
    its current shuffle block; the dataset unpins a shard after its last batch of the epoch).
    """

    def __init__(self, root: str, cache_dir: str | None = None, cache_limit: int | None = None,
                 policy: RemotePolicy | None = None):
        self.root, self.remote, self.limit = str(root), is_remote(root), cache_limit
        self.policy = policy or RemotePolicy()
        self.dir = None
        if self.remote:
            tag = hashlib.sha256(self.root.encode()).hexdigest()[:16]
            self.dir = os.path.join(cache_dir or default_cache_dir(), tag)
        self.fetched = 0

    def pin(self, rel: str, sha256: str, nbytes: int | None = None) -> tuple[str, Pin]:
        """(local path of file `rel`, its pin): fetched and checked first when remote and not cached."""
        if not self.remote:
            return join(local_path(self.root), rel), Pin()
        dest = os.path.join(self.dir, rel)
        lock = dest + LOCK
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        evicted, pause = 0, 0.005
        while evicted < ATTEMPTS:
            fd = _flock(lock, fcntl.LOCK_SH)  # waits while another process fetches the file
            if os.path.exists(dest):
                os.utime(dest)  # mtime is the LRU clock
                return dest, Pin(fd)
            os.close(fd)
            # Without waiting: a process that fetched the file first now pins it (shared), and
            # waiting for exclusive would wait for as long as it reads.
            fd = _flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is None:
                time.sleep(pause)
                pause = min(2 * pause, 0.5)
                continue
            try:
                if not os.path.exists(dest):
                    _remove_stale_temps(dest)
                    download(join(self.root, rel), dest, sha256, nbytes, self.policy)
                    self.fetched += 1
                # Not atomic (flock(2)): an evictor may take the lock in between; then fetch again.
                fcntl.flock(fd, fcntl.LOCK_SH)
                if os.path.exists(dest) and os.fstat(fd).st_ino == os.stat(lock).st_ino:
                    return dest, Pin(fd)
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            evicted += 1
        raise ShardError(f"cannot keep {join(self.root, rel)} in the cache: other processes evicted it "
                         f"{ATTEMPTS} times before it could be opened; cache_limit={self.limit} bytes is too "
                         "small for the shards in use at once: raise it (StreamingDataset(cache_limit=...))")

    def pin_shard(self, shard: ShardInfo) -> PinnedShard:
        """A shard and its index, local and pinned; over cache_limit, unpinned copies are evicted."""
        index, index_pin = None, Pin()
        if shard.index:
            index, index_pin = self.pin(shard.index["path"], shard.index["sha256"], shard.index.get("bytes"))
        try:
            path, pin = self.pin(shard.path, shard.sha256, shard.bytes)
        except BaseException:
            index_pin.release()
            raise
        self.evict()
        return PinnedShard(path, index, (pin, index_pin))

    def evict(self) -> int:
        """Delete least recently used copies that no process pins until the folder fits
        `cache_limit` (or nothing unpinned is left); returns bytes freed."""
        if self.limit is None or not self.remote or not os.path.isdir(self.dir):
            return 0
        guard = _flock(os.path.join(self.dir, EVICTOR_LOCK), fcntl.LOCK_EX)
        try:
            files, total = _listing(self.dir)
            freed = 0
            for _, size, path in sorted(files):
                if total - freed <= self.limit:
                    break
                fd = _flock(path.split(TMP)[0] + LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if fd is None:
                    continue  # pinned by a reader, or being fetched
                try:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)
                        freed += size
                    if TMP not in path:  # waiters on this lock file find it gone and lock a new one
                        os.remove(path + LOCK)
                finally:
                    os.close(fd)
            return freed
        finally:
            os.close(guard)


def _remove_stale_temps(dest: str) -> None:
    """Delete the temp files of fetches of `dest` that a killed process left behind. Called with
    dest's lock held exclusively, so no live fetch of dest owns one; without a cache_limit nothing
    else would ever delete them."""
    folder, prefix = os.path.split(dest + TMP)
    for name in os.listdir(folder):
        if name.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, name))


def _listing(folder: str) -> tuple[list[tuple[int, int, str]], int]:
    """(mtime_ns, size, path) of the cached files below folder, and the bytes they and fetches in
    progress hold. A temp file is listed first (oldest): it is deleted only if no fetch holds it."""
    files, total = [], 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            if name.endswith(LOCK):
                continue
            path = os.path.join(dirpath, name)
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(path)
                total += st.st_size
                files.append((-1 if TMP in name else st.st_mtime_ns, st.st_size, path))
    return files, total


@contextlib.contextmanager
def fetch_to_temp(root: str, shard: ShardInfo, policy: RemotePolicy | None = None):
    """Fetch one remote shard (and its index) into a temp folder, checked; removed on exit."""
    tmp = tempfile.mkdtemp(prefix="shardkit-fetch-")
    try:
        pinned = ShardCache(root, cache_dir=tmp, policy=policy).pin_shard(shard)
        try:
            yield pinned.path, pinned.index
        finally:
            pinned.release()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
