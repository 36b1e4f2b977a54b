"""Remote shards: fetched (reader.download) into a local cache that processes share (pinned, checksummed,
LRU-evicted), a large file as parallel ranged GETs over the cache's connections.

Each cached file `F` has a lock file `F.lock`. A reader holds a shared flock on it for as long as
it has the file open (a pin); the fetcher holds it exclusively while it downloads; an evictor
deletes `F` only after taking it exclusively without waiting, so it never deletes a file that a
process is fetching, opening or reading. The kernel drops a dead process's flocks, so a killed
reader or fetcher leaves nothing stuck.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid

from shardkit.contract import ShardInfo
from shardkit.errors import ShardError
from shardkit.store.remote import RangeIgnored, RemotePolicy
from shardkit.store.local import is_url, join, local_path, sha256_file
from shardkit.identity import pid_alive
from shardkit.reader.download import PART, download, help_with

LOCK = ".lock"
EVICTOR_LOCK = ".evictor.lock"  # one evictor at a time per cache folder
RESERVE = ".reserve-"  # room held for a fetch ahead: .reserve-{pid}-{id}, counted, never evicted while pid lives
TMP = ".tmp-"
FAILED = ".failed"  # beside a file whose last fetch failed: when, in which process, and why
ATTEMPTS = 3  # pin tries when evictors keep removing a freshly fetched file (cache far too small)


def default_cache_dir() -> str:
    """$SHARDKIT_CACHE, else a shardkit-cache folder in the system temp dir."""
    return os.environ.get("SHARDKIT_CACHE") or os.path.join(tempfile.gettempdir(), "shardkit-cache")


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
    """Local paths of a shard and its index sidecar, pinned until released. `partial`: in place of
    `path`, some rows of the shard read by range (reader.ranged), for a TarShard to read."""

    def __init__(self, path: str | None, index: str | None, pins: tuple[Pin, Pin], partial=None):
        self.path, self.index, self._pins, self.partial = path, index, pins, partial

    def release_index(self) -> None:
        """The index is read whole when the shard opens: after that it may go."""
        self._pins[1].release()

    def release(self) -> None:
        for pin in self._pins:
            pin.release()


class ShardCache:
    """Local paths for shard files: the file itself when local, a cached copy when remote.

    A cached copy appears under its final name only after it was fetched whole and checked (its
    size always; its sha256 unless every value read from it is checked against its own checksum),
    so existence means complete. `cache_limit` bounds the bytes in this dataset's cache folder,
    plus the files that readers have pinned at that moment (each DataLoader worker pins the shards
    of its current shuffle block and those fetched ahead for it; the dataset unpins a shard after
    its last batch of the epoch). A large file's GETs run on `pool` (the process's connections);
    `on_fetch(nbytes)` is told each file fetched. A fetch that failed is recorded beside the file,
    and a process that started before the failure (`since`, seconds since the epoch) and waited on
    it fails at once with the same error instead of trying again.
    """

    def __init__(self, root: str, cache_dir: str | None = None, cache_limit: int | None = None,
                 policy: RemotePolicy | None = None, pool=None, on_fetch=None):
        self.root, self.remote, self.limit = str(root), is_url(root), cache_limit
        self.policy, self.pool, self.on_fetch = policy or RemotePolicy(), pool, on_fetch
        self.base, self.dir = cache_dir or default_cache_dir(), None
        if self.remote:
            self.dir = os.path.join(self.base, hashlib.sha256(self.root.encode()).hexdigest()[:16])
        self.fetched = 0
        self.ranges = None  # whether the store honours Range requests: learnt from the first large file
        self.since = time.time()

    def has(self, rel: str) -> bool:
        """Whether file `rel` is in the cache now (complete: only checked copies have final names)."""
        return not self.remote or os.path.exists(os.path.join(self.dir, rel))

    def pin(self, rel: str, sha256: str, nbytes: int | None = None, wait: bool = True,
            direct: bool = False, verify=True) -> tuple[str, Pin] | None:
        """(local path of file `rel`, its pin): fetched and checked first when remote and not cached.
        `wait=False`: None when another process is fetching (parts taken first: _help) or evicting it.
        `direct`: fetched by this thread, not queued on the connections (a small index sidecar: its
        lock is held while it downloads, and a reader waiting on it must not wait for whole shards).
        `verify`: check the fetched file's sha256 (reader.download)."""
        if not self.remote:
            return join(local_path(self.root), rel), Pin()
        dest = os.path.join(self.dir, rel)
        lock = dest + LOCK
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        evicted, pause = 0, 0.005
        while evicted < ATTEMPTS:
            # Shared: waits while another process fetches the file (or, not waiting, helps and leaves it to it).
            fd = _flock(lock, fcntl.LOCK_SH if wait else fcntl.LOCK_SH | fcntl.LOCK_NB)
            if fd is None:
                return self._help(rel, dest, nbytes)
            if os.path.exists(dest):
                stale = _stale(fd, dest, sha256)
                if stale is None:
                    os.utime(dest)  # mtime is the LRU clock
                    return dest, Pin(fd)
                os.close(fd)
                self._replace(lock, dest, rel, stale, sha256)
                continue
            os.close(fd)
            # Without waiting: a process that fetched the file first now pins it (shared), and
            # waiting for exclusive would wait for as long as it reads.
            fd = _flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is None:
                if not wait:
                    return self._help(rel, dest, nbytes)
                pause = _backoff(pause)
                continue
            got = self._fill(fd, rel, (sha256, nbytes, verify), direct)
            if got is not None:
                return got
            evicted += 1
        raise _evicted_too_often(join(self.root, rel), self.limit)

    def _help(self, rel: str, dest: str, nbytes: int | None) -> None:
        """Another process is fetching `rel`: when it comes in parts, take those this process's
        connections have room for (reader.download.help_with); then None, as pin(wait=False) says."""
        if self.pool is not None and nbytes and nbytes > PART and self.ranges is not False:
            try:
                help_with(dest, join(self.root, rel), nbytes, self.policy, self.pool)
            except RangeIgnored:  # the store sends whole files: this process reads them whole from now on
                self.ranges = False
        return None

    def _fill(self, fd: int, rel: str, expect: tuple, direct: bool) -> tuple[str, Pin] | None:
        """With `fd` (rel's lock) held exclusively: fetch `rel` unless another process just did, then
        turn the lock into a pin. None (fd closed) when an evictor took the file in between."""
        dest = os.path.join(self.dir, rel)
        try:
            if not os.path.exists(dest):
                self._fetch(rel, dest, expect, direct)
                _stamp(fd, expect[0])
            # Not atomic (flock(2)): an evictor may take the lock in between; then fetch again.
            fcntl.flock(fd, fcntl.LOCK_SH)
            if os.path.exists(dest) and os.fstat(fd).st_ino == os.stat(dest + LOCK).st_ino:
                return dest, Pin(fd)
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def _replace(self, lock: str, dest: str, rel: str, stamp: str, sha256: str) -> None:
        """`dest` is a copy of another build of `rel` (fetched for sha256 `stamp`): delete it, so
        that the next try fetches the manifest's. Refused while another process reads it."""
        fd = _flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            raise ShardError(f"cached copy {dest} of shard {join(self.root, rel)} is of another build of the dataset "
                             f"(fetched for sha256 {stamp[:16]}…, the manifest says {sha256[:16]}…) and another "
                             "process is reading it: the dataset was rebuilt while it was being read; stop the "
                             f"readers of the other build, or give this one another cache_dir than {self.base}")
        try:
            if os.path.exists(dest) and _stale(fd, dest, sha256) is not None:
                os.remove(dest)
        finally:
            os.close(fd)

    def _fetch(self, rel: str, dest: str, expect: tuple, direct: bool) -> None:
        """Download `rel` into `dest`, its lock held exclusively. A failure is recorded beside it for
        the processes waiting on the same file: those that started before it fail at once."""
        recorded = _failure(dest, self.since)
        if recorded is not None:
            raise ShardError(recorded)
        _remove_stale_temps(dest)
        sha256, nbytes, verify = expect
        try:
            learnt = download(join(self.root, rel), dest, sha256, nbytes, self.policy, None if direct else self.pool,
                              self.ranges, verify, self.base)
        except ShardError as e:
            _record_failure(dest, e)
            raise
        with contextlib.suppress(FileNotFoundError):
            os.remove(dest + FAILED)
        self.ranges = self.ranges if learnt is None else learnt
        self.fetched += 1
        if self.on_fetch is not None:
            self.on_fetch(os.path.getsize(dest))

    def reserve(self, nbytes: int) -> str | None:
        """Room in the cache for a fetch ahead of `nbytes`: a reservation file of that size (sparse)
        that every process's listing counts until `release`, made under the evictor lock after
        evicting, so that processes deciding at once cannot all take the same room. None when it
        does not fit; '' when there is no limit (nothing to release)."""
        if self.limit is None or not self.remote:
            return ""
        os.makedirs(self.dir, exist_ok=True)
        guard = _flock(os.path.join(self.dir, EVICTOR_LOCK), fcntl.LOCK_EX)
        try:
            self._evict(nbytes)
            if _listing(self.dir)[1] + nbytes > self.limit:
                return None
            path = os.path.join(self.dir, f"{RESERVE}{os.getpid()}-{uuid.uuid4().hex[:12]}")
            with open(path, "wb") as f:
                f.truncate(nbytes)
            return path
        finally:
            os.close(guard)

    @staticmethod
    def release(reservation: str | None) -> None:
        """Give back a reservation (the fetch landed, or failed)."""
        if reservation:
            with contextlib.suppress(FileNotFoundError):
                os.remove(reservation)

    def pin_shard(self, shard: ShardInfo, wait: bool = True, checked=None) -> PinnedShard | None:
        """A shard and its index, local and pinned; over cache_limit, unpinned copies are evicted.
        `wait=False`: None at once when another process is fetching the shard's file (only the
        shard's own lock is a reason to leave it). `checked(path, index)`: whether every value read
        from the fetched file will be checked against its own checksum (then its sha256 is not
        computed: one check per byte); None: check the sha256.

        The shard's download does not wait for its index: the index is pinned once the shard's
        bytes are in (for `checked`, or after), and waited for then: a sidecar of one round trip,
        often in the hands of this process's own rows read by range (a lock on a file is held
        against other threads too). Asked for first, an epoch's first shards started once their
        indexes had come, one round trip late (traced over the throttled store: bench/RESULTS.md,
        "The shards' downloads no longer wait for their indexes"). An index whose fetch already
        failed (recorded beside it) fails the call before the shard is fetched."""
        index = _ShardIndex(self, shard)
        verify = True if checked is None else (lambda path: index.verifies(path, checked))
        got = None
        try:
            if self.remote and shard.index and _failure(os.path.join(self.dir, shard.index["path"]), self.since):
                index.pinned()  # raises the failure recorded (a fetch since `since` is tried again)
            got = self.pin(shard.path, shard.sha256, shard.bytes, wait, verify=verify)
            if got is None:
                index.release()
                return None
            index_path, index_pin = index.pinned()
        except BaseException:
            index.release()
            if got is not None:
                got[1].release()
            raise
        self.evict()
        return PinnedShard(got[0], index_path, (got[1], index_pin))

    def evict(self) -> int:
        """Delete least recently used copies that no process pins until the folder fits
        `cache_limit` (or nothing unpinned is left); returns bytes freed."""
        if self.limit is None or not self.remote or not os.path.isdir(self.dir):
            return 0
        guard = _flock(os.path.join(self.dir, EVICTOR_LOCK), fcntl.LOCK_EX)
        try:
            return self._evict()
        finally:
            os.close(guard)

    def _evict(self, room: int = 0) -> int:
        """evict(), the evictor lock held, until `room` more bytes fit as well."""
        files, total = _listing(self.dir)
        freed = 0
        for _, size, path in sorted(files):
            if total - freed + room <= self.limit:
                break
            if os.path.basename(path).startswith(RESERVE):
                if not pid_alive(int(os.path.basename(path)[len(RESERVE):].split("-")[0])):
                    with contextlib.suppress(FileNotFoundError):  # a killed process's reservation
                        os.remove(path)
                        freed += size
                continue
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


# A cached copy is stamped with the sha256 the manifest gave when it was fetched, in its lock file
# (which lives and dies with it): a copy of another build of the dataset (rebuilt since, same paths
# and sizes) must not be read as this one's. Its values' checksums would not tell: a Parquet shard
# carries them inside, and a tar shard's index sidecar is stamped like any cached file.
def _backoff(pause: float) -> float:
    """Sleeps `pause` seconds; returns the next pause, twice as long, at most 0.5 s."""
    time.sleep(pause)
    return min(2 * pause, 0.5)


def _evicted_too_often(url: str, limit: int | None) -> ShardError:
    """The error when other processes evicted a file ATTEMPTS times before it could be pinned."""
    return ShardError(f"cannot keep {url} in the cache: other processes evicted it "
                      f"{ATTEMPTS} times before it could be opened; cache_limit={limit} bytes is too "
                      "small for the shards in use at once: raise it (StreamingDataset(cache_limit=...))")


def _stamp(fd: int, sha256: str) -> None:
    """Record in lock fd that its file was fetched (and checked) for `sha256`. A disk too full for
    the stamp leaves it empty or short: the file, already checked, is hashed again when next pinned
    (`_stale`), and the full disk is reported by the next write that matters (a DiskError)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, sha256.encode(), 0)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise


def _stale(fd: int, dest: str, sha256: str) -> str | None:
    """None when cached file `dest` (lock fd held) is the copy the manifest's `sha256` names, else
    the sha256 it was fetched for. A copy without a whole stamp (cached before stamps were written,
    or its stamp refused or cut short by a full disk) is hashed."""
    stamp = os.pread(fd, 128, 0).decode("ascii", "replace").strip()
    if len(stamp) != len(sha256):  # none (or one cut short by a full disk)
        stamp = sha256_file(dest)
        if stamp == sha256:  # every holder of the lock writes the same bytes
            _stamp(fd, stamp)
    return None if stamp == sha256 else stamp


def _record_failure(dest: str, error: ShardError) -> None:
    with contextlib.suppress(OSError):  # a disk too full for this: the others try for themselves
        with open(dest + FAILED, "w") as f:
            json.dump({"time": time.time(), "pid": os.getpid(), "error": str(error)}, f)


def _failure(dest: str, since: float) -> str | None:
    """The error of a fetch of `dest` that failed since `since` (in any process), else None."""
    try:
        with open(dest + FAILED) as f:
            record = json.load(f)
        if record["time"] >= since:
            return (f"{record['error']} (failed {time.time() - record['time']:.0f} s ago in process {record['pid']}, "
                    "which shares this cache; tried again from the next epoch)")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


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
            if name.endswith((LOCK, FAILED)):
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


class _ShardIndex:
    """A shard's index sidecar, pinned in `cache` on first need (for the shard's verify, or once its
    file is in), once; an error pinning it is raised by `pinned()` (inside verify the shard's own
    sha256 is checked instead, so that the shard's bytes are not recorded as failed for its index)."""

    def __init__(self, cache: ShardCache, shard: ShardInfo):
        self.cache, self.shard = cache, shard
        self.got: tuple[str | None, Pin] | None = None if shard.index else (None, Pin())
        self.error: BaseException | None = None

    def pinned(self) -> tuple[str | None, Pin]:
        if self.got is None:
            if self.error is not None:
                raise self.error
            index = self.shard.index
            self.got = self.cache.pin(index["path"], index["sha256"], index.get("bytes"), True, direct=True)
        return self.got

    def verifies(self, path: str, checked) -> bool:
        """Whether the shard file at `path` needs its sha256 checked (checked(path, index) says not)."""
        try:
            index = self.pinned()[0]
        except ShardError as e:
            self.error = e
            return True
        return not checked(path, index)

    def release(self) -> None:
        if self.got is not None:
            self.got[1].release()
