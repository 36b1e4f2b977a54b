"""StreamingDataset's options (StreamConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.config.common import choice, parse_bytes, positive
from shardkit.errors import ON_ERROR_CHOICES, ConfigError


VARIANT_POLICIES = ("cycle", "random")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int32", "int64")  # token ids: int64 by default (cross_entropy's targets), int32 to halve them
DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "long": "int64",
                 "int": "int32"}  # torch's other names
TOKEN_MODES = ("train", "rows")


@dataclass(frozen=True)
class StreamConfig:
    """StreamingDataset options (shardkit.reader.dataset): every keyword is one field here."""

    seed: int = 0
    shuffle: bool = True
    shuffle_buffer: int = 16384  # samples per shuffle block: ids only, data is read by offset
    fields: tuple[str, ...] | None = None
    format: str | None = None  # "tar" or "parquet"; None: tar when the dataset has it (reader.dataset.read_format)
    drop_remainder: bool = False
    cache_dir: str | None = None
    cache_limit: int | str | None = None
    on_error: str = "fail"
    variant: str = "cycle"  # offline-augmented fields: "cycle" (epoch + h(key)) mod K, or "random" (seeded)
    dtype: str | None = None  # float arrays cast to this ("float32", torch.float32, ...), token ids widened
    # to this ("int64" when None); None: floats as stored
    tokens: str | None = None  # token datasets: "train" (input_ids, labels, position_ids, document_ids) or
    # "rows" (the stored rows, padding included); None: "train" where the layout allows it
    mask_boundaries: bool = False  # labels: IGNORE_INDEX also where the next document's first id is predicted
    keys: bool | None = None  # "__key__" in each batch; None: yes, except for packed token rows
    checksums: bool = True  # check every value read against the checksum recorded at build time
    timeout: float = 15.0  # remote reads: seconds to connect, and at most between two reads with data
    retries: int = 2  # remote reads: more tries after a timeout, reset or HTTP 5xx/429 (backoff 1, 2, 4 s …)
    # Remote reads: GETs of whole shards in flight per process (each DataLoader worker is one), a
    # large shard as ranged GETs of 4 MiB; 8 x 25 MB/s per connection saturates a typical object
    # store's link. Rows read by range (mostly latency) get 8x as many threads of their own.
    connections: int = 8
    # Remote reads: shards per process fetched ahead of the reader in plan order (within
    # cache_limit, pinned until read); 0 fetches each shard when a batch first needs it.
    fetch_ahead: int = 8
    where: str | None = None  # keep only samples whose attributes satisfy this (reader/where.py)

    def __post_init__(self):
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed={self.seed!r}: expected an integer >= 0 (StreamingDataset(seed=...))")
        if self.where is not None and not isinstance(self.where, str):
            raise ConfigError(f"where={self.where!r}: expected an expression string, e.g. \"lang == 'en' and "
                              "gopher_quality\" (StreamingDataset(where=...))")
        positive("shuffle_buffer", self.shuffle_buffer, "StreamingDataset(shuffle_buffer=...)")
        positive("connections", self.connections, "StreamingDataset(connections=...)")
        if not isinstance(self.fetch_ahead, int) or isinstance(self.fetch_ahead, bool) or self.fetch_ahead < 0:
            raise ConfigError(f"fetch_ahead={self.fetch_ahead!r}: expected an integer >= 0 (shards fetched ahead "
                              "per process; 0 turns fetching ahead off) (StreamingDataset(fetch_ahead=...))")
        choice("format", self.format, (None, "tar", "parquet"), "StreamingDataset(format=...)")
        choice("on_error", self.on_error, ON_ERROR_CHOICES, "StreamingDataset(on_error=...)")
        choice("variant", self.variant, VARIANT_POLICIES, "StreamingDataset(variant=...)")
        choice("checksums", self.checksums, (True, False), "StreamingDataset(checksums=...)")
        if self.dtype is not None:  # kept by name: this module imports neither torch nor numpy
            name = getattr(self.dtype, "__name__", None) or str(self.dtype).removeprefix("torch.")  # np.float32
            name = DTYPE_ALIASES.get(name, name)
            choice("dtype", name, FLOAT_DTYPES + INT_DTYPES, "StreamingDataset(dtype=...)")
            object.__setattr__(self, "dtype", name)
        choice("tokens", self.tokens, (None,) + TOKEN_MODES, "StreamingDataset(tokens=...)")
        for name in ("mask_boundaries", "keys"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "keys" and value is None):
                raise ConfigError(f"{name}={value!r}: expected True or False (StreamingDataset({name}=...))")
        if self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))
        if self.cache_limit is not None:
            object.__setattr__(self, "cache_limit", parse_bytes(self.cache_limit))
        self.remote_policy()  # validates timeout and retries

    def remote_policy(self):
        """The timeouts and retries of remote reads (shardkit.store.remote.RemotePolicy), a reader's:
        its reads keep obstore's runtime out of a process that will fork DataLoader workers."""
        from shardkit.store.remote import RemotePolicy

        return RemotePolicy(timeout=self.timeout, retries=self.retries, forks=True)
