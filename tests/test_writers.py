"""Writers: a table assembled from parts (work units) writes the same shard as one table."""

from __future__ import annotations

import pyarrow as pa

from shardkit.sample import Sample
from shardkit.writers.parquet import samples_table, write_parquet_table
from shardkit.writers.tar import write_tar_table

FIELDS = {"jpg": {"kind": "image", "encoding": "jpeg"}, "cls": {"kind": "int", "dtype": "int64"},
          "txt": {"kind": "text"}, "json": {"kind": "json"}}


def test_a_table_assembled_from_parts_writes_the_same_shard(tmp_path):
    samples = [Sample(f"k/{i:03d}", {"jpg": bytes([i]) * (i * 37 % 700), "txt": f"näme {i}" * (i % 4),
                                      "json": {"i": i, "f": i / 3}} | ({"cls": i % 3} if i % 5 else {}))
               for i in range(40)]
    whole = samples_table(samples, FIELDS)
    parts = pa.concat_tables([samples_table(samples[a:b], FIELDS) for a, b in ((0, 7), (7, 8), (8, 40))])
    one, two = tmp_path / "one", tmp_path / "two"
    for writer in (write_tar_table, write_parquet_table):
        a, b = writer(whole, str(one), 0, FIELDS), writer(parts, str(two), 0, FIELDS)
        assert a == b and (one / a.path).read_bytes() == (two / b.path).read_bytes()
