"""A source file streamed from S3 (store.open_source, as a tar or Parquet source is read): obstore's
ranged blocks read ahead against the same without reading ahead and against s3fs's file, over a local S3 server (moto) that waits `--latency`
before answering each GET (a store that far away), in one run, alternating.

    .venv/bin/python bench/source_stream_bench.py [--mb 96] [--latency 0.05] [--rounds 3]

Per run: the seconds to read the whole object in 64 KiB reads from a fresh open, and the GETs the
server answered. The client CPU is the process's (the server runs in it too, so it is not split).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "tests")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=96)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import pytest
    from moto.server import DomainDispatcherApplication

    import moto_store
    from shardkit import store

    monkeypatch = pytest.MonkeyPatch()
    gets = []
    real = DomainDispatcherApplication.__call__

    def far(self, environ, start_response):
        if environ["REQUEST_METHOD"] == "GET":
            gets.append(1)
            time.sleep(args.latency)
        return real(self, environ, start_response)

    with tempfile.TemporaryDirectory() as tmp:
        import pathlib

        s3 = moto_store.start_s3(pathlib.Path(tmp), monkeypatch)
        try:
            url = s3.url("stream/blob.bin")
            data = os.urandom(args.mb << 20)
            store.write(url, data)
            monkeypatch.setattr(DomainDispatcherApplication, "__call__", far)
            import concurrent.futures

            from shardkit.store import objstore

            ahead = objstore.fetch_range

            def no_ahead(*_):  # a read ahead that never comes: each block is then read when needed
                f = concurrent.futures.Future()
                f.set_exception(ConnectionError("no read ahead"))
                return f

            clients = ["obstore", "obstore, no read ahead", "fsspec"]
            times: dict = {c: [] for c in clients}
            for r in range(args.rounds):
                for client in clients[r % 3:] + clients[:r % 3]:
                    if client == "fsspec":
                        os.environ["SHARDKIT_OBJECT_CLIENT"] = "fsspec"
                    else:
                        os.environ.pop("SHARDKIT_OBJECT_CLIENT", None)
                    objstore.fetch_range = no_ahead if client.endswith("no read ahead") else ahead
                    gets.clear()
                    t = time.perf_counter()
                    with store.open_source(url) as f:
                        n = sum(len(b) for b in iter(lambda: f.read(64 << 10), b""))
                    seconds = time.perf_counter() - t
                    assert n == len(data)
                    times[client].append(seconds)
                    print(f"round {r} {client:22s} {seconds:.2f} s, {args.mb / seconds:.0f} MB/s, "
                          f"{len(gets)} GETs", flush=True)
            for client, got in times.items():
                print(f"{client}: median {statistics.median(got):.2f} s ({args.mb / statistics.median(got):.0f} MB/s)")
        finally:
            os.environ.pop("SHARDKIT_OBJECT_CLIENT", None)
            moto_store.stop_s3(s3)
            monkeypatch.undo()


if __name__ == "__main__":
    main()
