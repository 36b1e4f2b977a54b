"""The tar writer's headers are the ones tarfile writes, byte for byte, whatever the name and size."""

import random

from shardkit.writers.tar import _header, _tarfile_header


def test_template_headers_equal_tarfiles():
    rng = random.Random(0)
    alphabet = "abcXYZ019_-/é☃"
    for _ in range(3000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 110)))  # some over 100 bytes
        size = rng.choice([0, 1, 511, 512, rng.randint(0, 10**9), 8**11 - 1, 8**11])
        assert _header(name, size) == _tarfile_header(name, size), (name, size)


def _old_rule(name: bytes, field_bytes: bytes) -> bool:
    """The per-row rule _check_headers applied before it compared whole fields at once."""
    stored = field_bytes.rstrip(b"\0")
    return name.startswith(stored) and len(stored) >= min(len(name), 99)


def test_header_names_checked_at_once_decide_as_the_per_row_rule():
    """Real headers (names of 1-110 bytes, multi-byte characters; a long one has its GNU long-name
    blocks before it), some damaged in their name field (a byte changed, the name cut short, bytes
    after its end): TarShard's check accepts exactly the rows the per-row rule accepts, and names
    the first one it rejects."""
    import re

    import numpy as np
    import pytest

    from shardkit.errors import ShardError
    from shardkit.reader.shards import TarShard

    rng = random.Random(1)
    alphabet = "abcXYZ019_-é☃"
    for trial in range(301):
        keys = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 106))) for _ in range(rng.randint(1, 12))]
        if trial == 300:  # a name of 100+ bytes whose header keeps 99 of them and a NUL: accepted
            keys = ["k" * 103, "short"]
        buf, offsets = bytearray(), []
        for key in keys:
            buf += _header(f"{key}.jpg", 4)
            offsets.append(len(buf))  # the member's data: right after its own header (the last block)
            buf += bytes(512)
        for o in offsets:
            at = o - 512  # the member's header: its name field is its first 100 bytes
            if trial == 300:
                buf[at + 99] = 0 if o == offsets[0] else buf[at + 99]
            elif rng.random() < 0.3:
                kind = rng.choice(["flip", "cut", "tail"])
                if kind == "flip":
                    buf[at + rng.randrange(100)] ^= 1 << rng.randrange(8)
                elif kind == "cut":
                    j = rng.randrange(100)
                    buf[at + j:at + 100] = bytes(100 - j)
                else:
                    buf[at + rng.randrange(1, 100)] = ord("x")
        expect = [_old_rule(f"{k}.jpg".encode(), bytes(buf[o - 512:o - 412])) for k, o in zip(keys, offsets)]
        if trial == 300:
            assert expect == [True, True]
        shard = TarShard.__new__(TarShard)
        shard.url, shard.mm, shard.buf, shard.keys = "s.tar", bytes(buf), np.frombuffer(bytes(buf), np.uint8), keys
        shard.offsets, shard.sizes = {"jpg": np.array(offsets, np.int64)}, {"jpg": np.full(len(keys), 4, np.int64)}
        if all(expect):
            shard._check_headers()
        else:
            first = keys[expect.index(False)]
            with pytest.raises(ShardError, match="the header before " + re.escape(f"{first}.jpg ")):
                shard._check_headers()
