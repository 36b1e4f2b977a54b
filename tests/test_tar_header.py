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
