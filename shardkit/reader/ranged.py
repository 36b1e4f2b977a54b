"""Rows of remote tar shards read by ranged GETs: for batches that cannot wait for whole shards, and
for one sample (ds[i], ds.get, `shardkit show`) without its shard.

A worker's first batch of an epoch draws its samples from a whole shuffle block, so it needs many
shards; waiting for them all took seconds. Reading just the rows asked for (one GET per run of
adjacent rows: a sample's members lie side by side in the tar) at the offsets the shard's index
sidecar records takes two round trips: the sidecar (cached, it is needed anyway), then the rows.
The rows land at their own offsets in an anonymous mapping the shard's size (pages are only
allocated where something was written), and a TarShard reads them from it as from the file; each
value is checked against the xxh3 the index records, so this path needs checksums on.
"""

from __future__ import annotations

import mmap
import queue
from concurrent.futures import Future

import numpy as np

from shardkit.contract import CHECKSUM_SUFFIX, ShardInfo
from shardkit.errors import ShardError
from shardkit.store.remote import RemoteError, open_ahead, opens_ahead, read_range
from shardkit.reader import ranged_parquet
from shardkit.reader.cache import Pin, PinnedShard
from shardkit.reader.shards import read_index

# Rows whose bytes lie this close are read in one GET: a round trip costs far more than the gap
# (tar headers between adjacent samples: 512 bytes per member).
MERGE_GAP = 64 << 10


class Landed:
    """One shard's rows read by range so far, in this process: `buf` (the shard's size, a row's
    bytes at their own offsets), `spans` ((lo, hi) of each row's members, from its index) and
    `landed` (rows whose bytes are in `buf`). `pinned` is what the reader opens (reader.cache.PinnedShard)."""

    def __init__(self, shard: ShardInfo, index_path: str, url: str, pinned: PinnedShard):
        self.spans = _spans(index_path, shard, url)
        self.buf = mmap.mmap(-1, max(1, shard.bytes))  # anonymous: zero pages until written
        self.landed = np.zeros(shard.samples, bool)
        self.pinned = pinned
        pinned.partial = self.buf

    def missing(self, rows) -> np.ndarray:
        rows = np.unique(np.asarray(rows, np.int64))
        return rows[~self.landed[rows]]

    def gets(self, rows) -> list[tuple[int, int]]:
        """The (lo, hi) GETs that bring `rows` (not landed yet)."""
        return [(lo, hi) for lo, hi, _ in runs(self.spans, rows)]

    def arrived(self, ranges) -> None:
        """Bytes `ranges` are in buf now (rows are marked landed by the caller)."""


def _spans(index_path: str, shard: ShardInfo, url: str) -> np.ndarray:
    """(lo, hi) of the bytes holding each row's present members (adjacent in the tar); an error
    when a field has no checksums (a reader could not tell a row that never landed)."""
    import pyarrow.parquet as pq

    try:
        t = pq.ParquetFile(read_index(index_path, shard, url)).read(use_threads=False)
    except ShardError:
        raise
    except Exception as e:  # pyarrow errors: the index cannot be used
        raise ShardError(f"cannot open shard {url}: {type(e).__name__}: {e}; rebuild the dataset") from e
    fields = [n[:-7] for n in t.column_names if n.endswith(".offset")]
    if any(f + CHECKSUM_SUFFIX not in t.column_names for f in fields):
        raise Unchecked(url)
    lo = np.full(t.num_rows, np.iinfo(np.int64).max)
    hi = np.zeros(t.num_rows, np.int64)
    for f in fields:
        o = t.column(f + ".offset").to_numpy().astype(np.int64)
        end = o + t.column(f + ".size").to_numpy().astype(np.int64)
        present = o >= 0
        lo = np.where(present, np.minimum(lo, o), lo)
        hi = np.where(present, np.maximum(hi, end), hi)
    lo = np.where(hi > 0, lo, 0)  # a row with no member at all: an empty span
    return np.stack([lo, hi], axis=1)


def _consecutive_runs(rows) -> int:
    """Runs of consecutive row numbers among `rows`: the most GETs they take (runs() may merge more)."""
    rows = np.unique(np.asarray(rows, np.int64))
    return int(len(rows) and 1 + np.count_nonzero(np.diff(rows) > 1))


class _Carriers:
    """n threads of `pool` (`start`), each of which opens its connection to url's store, then runs
    the jobs handed to `run` until `close()`, so that the GETs go on the connections opened (a
    pool's next tasks may start new threads rather than take its idle ones). A carrier left
    waiting would hold the process's exit (the pool's threads are joined then): the caller starts
    them inside the try whose finally closes them."""

    def __init__(self, pool, url: str, policy, n: int):
        self.pool, self.url, self.policy, self.n, self.jobs = pool, url, policy, n, queue.SimpleQueue()

    def start(self) -> None:
        for _ in range(self.n):
            self.pool.submit(self._carry, self.url, self.policy)

    def _carry(self, url: str, policy) -> None:
        open_ahead(url, policy)
        while (job := self.jobs.get()) is not None:
            fn, arg, future = job
            try:
                future.set_result(fn(arg))
            except BaseException as e:  # noqa: BLE001 — the caller's to raise
                future.set_exception(e)

    def run(self, fn, args) -> list:
        """[fn(a) for a in args], each on a carrier (at most n at once), in order; the first failure raised."""
        futures = [Future() for _ in args]
        for arg, future in zip(args, futures):
            self.jobs.put((fn, arg, future))
        return [future.result() for future in futures]

    def close(self) -> None:
        """Every carrier ends once the jobs before it are done (a carrier a start cut short never
        began: its end waits in the queue, unread)."""
        for _ in range(self.n):
            self.jobs.put(None)


class Unchecked(ShardError):
    """The shard's index records no checksums (an older build): its rows cannot be read by range."""

    def __init__(self, url: str):
        super().__init__(f"shard {url}: its index has no checksums, so its rows are read from the whole shard")


def runs(spans: np.ndarray, rows: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """(start, end, rows) of the GETs that fetch `rows`: rows sorted by offset, merged while the
    gap between them is at most MERGE_GAP."""
    rows = rows[spans[rows, 1] > spans[rows, 0]]  # a row with nothing stored needs no bytes
    rows = rows[np.argsort(spans[rows, 0], kind="stable")]
    out: list = []
    for r in rows.tolist():
        lo, hi = int(spans[r, 0]), int(spans[r, 1])
        if out and lo - out[-1][1] <= MERGE_GAP:
            out[-1][1] = max(out[-1][1], hi)
            out[-1][2].append(r)
        else:
            out.append([lo, hi, [r]])
    return [(lo, hi, np.asarray(rs, np.int64)) for lo, hi, rs in out]


class RangedRows:
    """The rows of remote shards read by range in one process, per shard (a Landed each), fetched
    on `pool` (of `threads` threads) with `policy`; an error of shard s passes through `tag(error, s)`."""

    def __init__(self, pool, policy, tag, specs=None, threads: int = 1):
        self.pool, self.policy, self.tag, self.specs, self.threads = pool, policy, tag, specs or {}, threads
        self.landed: dict[int, Landed] = {}
        self.unchecked: set[int] = set()  # shards whose index has no checksums: read whole

    def ready(self, s: int, rows) -> bool:
        """Whether these rows of shard s were read already (nothing to fetch)."""
        return s in self.landed and not len(self.landed[s].missing(rows))

    def read(self, items) -> tuple[dict, int]:
        """({s: PinnedShard over its rows}, bytes fetched) for each (s, cache, shard, url, rows) of
        `items`: first every index not here yet (pinned in its cache), then every row, each wave
        at once. A shard whose index has no checksums is left out (and noted in `unchecked`)."""
        fresh = [item for item in items if item[0] not in self.landed]
        indexes = self.pool.map(self._index, fresh)  # sent first
        carriers = self._carriers(fresh)
        try:
            if carriers is not None:
                carriers.start()
            for item, landed in zip(fresh, indexes):
                if landed is not None:
                    self.landed[item[0]] = landed
            items = [item for item in items if item[0] in self.landed]
            gets = [(s, url, lo, hi) for s, _, _, url, rows in items
                    for lo, hi in self.landed[s].gets(self.landed[s].missing(rows))]
            if carriers is not None:  # the connected threads carry the first GETs, the pool the rest
                rest = self.pool.map(self._get, gets[carriers.n:])
                fetched = sum(carriers.run(self._get, gets[:carriers.n])) + sum(rest)
            else:
                fetched = sum(self.pool.map(self._get, gets)) if len(gets) > 1 else sum(map(self._get, gets))
        finally:
            if carriers is not None:
                carriers.close()
        for s, _, _, _, rows in items:  # rows with nothing stored count as landed too
            self.landed[s].arrived([(lo, hi) for t, _, lo, hi in gets if t == s])
            self.landed[s].landed[np.asarray(rows, np.int64)] = True
        return {s: self.landed[s].pinned for s, *_ in items}, fetched

    def _carriers(self, fresh) -> "_Carriers | None":
        """While the indexes of `fresh` come: threads of the pool that open their connection to the
        store (TCP, and TLS for https) and then carry the rows' GETs; at most one per GET the rows
        may take (a run of consecutive rows lies side by side in the tar: one GET) and as many as
        the pool has beside the index GETs (an index thread may carry no connection: it may wait for
        an index another thread or process fetches). A first batch's rows otherwise went out on as
        many new threads, each connecting first: a TLS handshake (a round trip and ~1 ms of CPU)
        before each GET. None where the store's client keeps its own pool (obstore, s3fs)."""
        urls = {url for _, _, _, url, _ in fresh if opens_ahead(url)}
        if not urls:
            return None
        n = min(self.threads - len(fresh), sum(_consecutive_runs(rows) for *_, rows in fresh))
        if n <= 0:
            return None
        return _Carriers(self.pool, min(urls), self.policy, n)  # one store: the dataset's root's host

    def drop(self, s: int, pinned) -> None:
        """The reader closed shard s (opened from `pinned`): its rows go."""
        if s in self.landed and self.landed[s].pinned is pinned:
            del self.landed[s]

    def _index(self, item) -> Landed | None:
        s, cache, shard, url, _ = item
        if shard.format == "parquet":
            return self._footer(item)
        try:
            index, pin = cache.pin(shard.index["path"], shard.index["sha256"], shard.index.get("bytes"), direct=True)
        except ShardError as e:
            raise self.tag(e, s)
        try:
            return Landed(shard, index, url, PinnedShard(None, index, (Pin(), pin)))
        except Unchecked:
            pin.release()
            self.unchecked.add(s)
            return None
        except ShardError as e:
            pin.release()
            raise self.tag(e, s)

    def _footer(self, item):
        """A Parquet shard's LandedParquet: its footer (and offset indexes) read by range."""
        s, _, shard, url, _ = item
        pinned = PinnedShard(None, None, (Pin(), Pin()))

        def read(lo, hi, buf):
            self._get((s, url, lo, hi), buf)

        try:
            pinned.partial = ranged_parquet.LandedParquet(shard, url, self.specs, read, pinned)
        except ranged_parquet.Unchecked:
            self.unchecked.add(s)
            return None
        except ShardError as e:
            raise self.tag(e, s)
        return pinned.partial

    def _get(self, get, buf=None) -> int:
        s, url, lo, hi = get
        try:
            read_range(url, lo, hi, self.policy, memoryview(self.landed[s].buf if buf is None else buf)[lo:hi])
        except RemoteError as e:
            raise self.tag(ShardError(f"cannot fetch shard {url}: {e.detail}"), s) from e
        return hi - lo
