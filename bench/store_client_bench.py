"""Client CPU per request to an object store: the fsspec path (s3fs, adlfs for Azure, gcsfs for
GCS, through shardkit.store) against obstore.

A local S3 server (moto), Azurite for `--store azure` or fake-gcs-server for `--store gcs`, runs in a separate process, so its CPU is
not counted; the figure is this process's user+system CPU (all its threads: fsspec's event loop,
obstore's tokio runtime) divided by the number of requests. Clients alternate round by round on
the same objects (STYLE 15).

    PYTHONPATH=$PWD python bench/store_client_bench.py [--small 300] [--large 12] [--rounds 3]
    PYTHONPATH=$PWD python bench/store_client_bench.py --store azure   # Azurite from `make` (.venv/azurite)
    PYTHONPATH=$PWD python bench/store_client_bench.py --store gcs     # GETs only on obstore: it reads gs://
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

SERVER = """
import logging, sys, time
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.WARNING)
s = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
s.start()
print("%s:%s" % s.get_host_and_port(), flush=True)
sys.stdin.read()  # until the bench closes our stdin
"""
BUCKET = "bench"


def start_server(tmp: str) -> tuple[subprocess.Popen, str]:
    """moto in its own process, the host's AWS settings hidden (tests/moto_store.py does the same)."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    os.environ.update(AWS_CONFIG_FILE=os.path.join(tmp, "aws-config"), AWS_SHARED_CREDENTIALS_FILE=os.path.join(
        tmp, "aws-credentials"), AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1",
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret")
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    endpoint = "http://" + proc.stdout.readline().strip()
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    return proc, endpoint


def cpu_ms(fn, n: int) -> float:
    """Client CPU-ms per call of fn(i), i in range(n)."""
    start = time.process_time()
    for i in range(n):
        fn(i)
    return (time.process_time() - start) * 1000 / n


def start_azurite() -> tuple[subprocess.Popen, str]:
    """Azurite in its own process (tests/azurite_store.py's), the bench's container made, and its
    connection string set the way adlfs and shardkit read it."""
    import azurite_store

    for name in [n for n in os.environ if n.startswith("AZURE_")]:
        del os.environ[name]
    proc = azurite_store.start_azurite()
    server = azurite_store.Azure(proc.endpoint, BUCKET, proc)
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = server.connection_string
    server.fs().mkdir(BUCKET)
    return proc, proc.endpoint


def start_gcs() -> tuple[subprocess.Popen, str]:
    """fake-gcs-server in its own process (tests/gcs_store.py's), the bench's bucket made, and
    STORAGE_EMULATOR_HOST set the way gcsfs and shardkit read it."""
    import gcs_store

    proc = gcs_store.start_fake_gcs()
    gcs_store.new_bucket(proc.endpoint, BUCKET)
    os.environ["STORAGE_EMULATOR_HOST"] = proc.endpoint
    return proc, proc.endpoint


SCHEME = {"s3": "s3", "azure": "az", "gcs": "gs"}


def clients(endpoint: str, kind: str = "s3"):
    """{name: (get(key) -> bytes, put(key, data) or None)} for each client measured."""
    import obstore
    from obstore.store import AzureStore, S3Store

    from shardkit import store
    from shardkit.store import objstore

    if kind == "s3":
        ob = S3Store(BUCKET, config={"endpoint": endpoint, "region": "us-east-1"}, client_options={"allow_http": True})
    elif kind == "gcs":
        from obstore.store import GCSStore

        ob = GCSStore(BUCKET, config=objstore._gcs_settings(), client_options={"allow_http": True})
    else:
        import azurite_store

        ob = AzureStore(BUCKET, config={"account_name": azurite_store.ACCOUNT, "account_key": azurite_store.KEY,
                                        "endpoint": endpoint}, client_options={"allow_http": True})

    def url(key):
        return f"{SCHEME[kind]}://{BUCKET}/{key}"

    def via(mode, fn):  # shardkit.store's calls with SHARDKIT_OBJECT_CLIENT=mode
        def call(*args):
            os.environ["SHARDKIT_OBJECT_CLIENT"] = mode
            return fn(*args)
        return call

    return {BASE[kind]: (via("fsspec", lambda k: store.read(url(k))), via("fsspec", lambda k, d: store.write(url(k), d))),
            "obstore (get/put), bare": (lambda k: bytes(obstore.get(ob, k).bytes()),
                                        None if kind == "gcs" else lambda k, d: obstore.put(ob, k, d)),
            "store.read/write on obstore": (via("obstore", lambda k: store.read(url(k))),
                                            via("obstore", lambda k, d: store.write(url(k), d)))}


BASE = {"s3": "s3fs (store.read/write)", "azure": "adlfs (store.read/write)", "gcs": "gcsfs (store.read/write)"}


def batch_ms(n: int, size: str, kind: str = "s3") -> dict:
    """Client CPU-ms per object of read_sources (concurrent GETs of a task's batch), each way."""
    from shardkit import store

    urls = [f"{SCHEME[kind]}://{BUCKET}/{size}/{i}" for i in range(n)]
    out = {}
    for mode in ("fsspec", "obstore"):
        os.environ["SHARDKIT_OBJECT_CLIENT"] = mode
        store.read_sources(urls[:4])  # connections made, imports done
        batch = lambda i: store.read_sources(urls[i * 50:(i + 1) * 50])  # noqa: E731
        out[f"read_sources batch, {mode}"] = cpu_ms(batch, n // 50) / 50
    os.environ.pop("SHARDKIT_OBJECT_CLIENT", None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=300, help="40 KB objects per client per round")
    ap.add_argument("--large", type=int, default=12, help="4 MB objects per client per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store", choices=("s3", "azure", "gcs"), default="s3",
                    help="s3: moto (s3fs against obstore); azure: Azurite (adlfs against obstore); gcs: "
                         "fake-gcs-server (gcsfs against obstore's GETs)")
    args = ap.parse_args()
    if args.store in ("azure", "gcs"):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        import azurite_store
        import gcs_store

        proc, endpoint = start_azurite() if args.store == "azure" else start_gcs()
        try:
            run(args, endpoint)
        finally:
            azurite_store.stop_azurite(proc) if args.store == "azure" else gcs_store.stop_process(proc)
        return
    with tempfile.TemporaryDirectory() as tmp:
        proc, endpoint = start_server(tmp)
        try:
            import boto3

            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            run(args, endpoint)
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)


def run(args, endpoint: str) -> None:
    sizes = {"40KB": (40_000, args.small), "4MB": (4_000_000, args.large)}
    data = {s: os.urandom(b) for s, (b, _) in sizes.items()}
    table: dict[tuple, list] = {}
    cl = clients(endpoint, args.store)
    writer = next(iter(cl.values()))[1]  # the fsspec path's: it writes on every store
    writer("warm", b"x")
    for name, (get, put) in cl.items():  # warm: imports, connections, credentials
        get("warm")
    for r in range(args.rounds):
        for name, (get, put) in cl.items():
            for s, (_, n) in sizes.items():
                if put is not None:
                    table.setdefault((name, s, "PUT"), []).append(cpu_ms(lambda i: put(f"{s}/{i}", data[s]), n))
                elif r == 0:  # the objects the GETs read, written by the fsspec path (not timed)
                    [writer(f"{s}/{i}", data[s]) for i in range(n)]
                table.setdefault((name, s, "GET"), []).append(cpu_ms(lambda i: get(f"{s}/{i}"), n))
    try:
        for k, v in batch_ms(args.small - args.small % 50, "40KB", args.store).items():
            table[(k, "40KB", "GET")] = [v]
    except ImportError:
        pass
    base = BASE[args.store]
    print(f"{'client':34} {'size':5} {'op':4} {'CPU-ms/request (median of rounds)':>34} {'vs ' + base.split()[0]:>8}")
    for (name, s, op), v in sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        med = sorted(v)[len(v) // 2]
        ref = sorted(table[(base, s, op)])[len(table[(base, s, op)]) // 2]
        print(f"{name:34} {s:5} {op:4} {med:34.3f} {ref / med:7.1f}x   rounds: "
              + ", ".join(f"{x:.2f}" for x in v))


if __name__ == "__main__":
    main()
