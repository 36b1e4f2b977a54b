"""Wall time of the walk of a large SRC on S3: one stream of listing pages against a stream per
folder, several at once (store.listing PARALLEL), each in a fresh process, alternating.

The store is a minimal S3 listing server in a process of its own (ListObjectsV2 only: prefix,
delimiter, start-after, continuation token, max-keys), holding `cls{i % folders}/{i:07d}.jpg` in
memory and answering each page after --latency seconds (S3 answers a page of 1,000 keys in ~50-100
ms), in threads, so pages asked for at once overlap. moto serves the same answers but spends ~0.1
ms of CPU a key rendering them, which on 2 cores bounds both ways alike; this server spends a few
µs, so the round trips are the bound, as on S3. The figure is the wall time of the walk (what
comes before a build's first task) and its client CPU, per round, and the ratio.

    PYTHONPATH=$PWD python bench/listing_parallel_bench.py [--objects 200000] [--folders 100] [--latency 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import object_store_bench  # noqa: E402  (bench/ is not a package)
from listing_cpu_bench import TIMED  # noqa: E402

WALK = ("import shardkit.store.listing as listing\n{switch}"
        "from shardkit.sources.walk import walk\nn = len(walk('s3://listing').files)")
WAYS = {"one stream": WALK.format(switch="listing.SWITCH = 10 ** 9\n"),
        "a stream per folder": WALK.format(switch="")}

SERVE = r"""
import bisect, http.server, sys, time, urllib.parse
from xml.sax.saxutils import escape
port, objects, folders, latency = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
names = sorted(f"cls{i % folders}/{i:07d}.jpg" for i in range(objects))
ITEM = ("<Contents><Key>{}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
        "<ETag>&quot;{:032x}&quot;</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>")

def page(q):
    prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
    most = min(int(q.get("max-keys", 1000)), 1000)
    after = q.get("continuation-token") or q.get("start-after") or ""
    i = bisect.bisect_right(names, after) if after else bisect.bisect_left(names, prefix)
    out, folders_seen = [], []
    while i < len(names) and names[i].startswith(prefix) and len(out) + len(folders_seen) < most:
        rest = names[i][len(prefix):]
        if delim and delim in rest:
            folder = prefix + rest.split(delim)[0] + delim
            folders_seen.append(folder)
            i = bisect.bisect_left(names, folder[:-1] + chr(ord(delim) + 1))
            last = folder + "\U0010ffff"
        else:
            out.append(names[i])
            last = names[i]
            i += 1
    more = i < len(names) and names[i].startswith(prefix)
    url = q.get("encoding-type") == "url"
    enc = (lambda k: urllib.parse.quote(k, safe="/")) if url else escape
    body = ['<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
            f"<Name>listing</Name><Prefix>{enc(prefix)}</Prefix><KeyCount>{len(out) + len(folders_seen)}</KeyCount>",
            f"<MaxKeys>{most}</MaxKeys>", f"<Delimiter>{enc(delim)}</Delimiter>" if delim else "",
            "<EncodingType>url</EncodingType>" if url else "",
            f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>"]
    if more:
        body.append(f"<NextContinuationToken>{escape(last)}</NextContinuationToken>")
    body += [ITEM.format(enc(k), hash(k) & (1 << 128) - 1) for k in out]
    body += [f"<CommonPrefixes><Prefix>{enc(f)}</Prefix></CommonPrefixes>" for f in folders_seen]
    body.append("</ListBucketResult>")
    return "".join(body).encode()

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        path, _, query = self.path.partition("?")
        q = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        if path.strip("/") != "listing" or q.get("list-type") != "2":
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers(); return
        time.sleep(latency)
        data = page(q)
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    do_HEAD = do_GET

server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
server.daemon_threads = True
print("ready", flush=True)
server.serve_forever()
"""


def serve(objects: int, folders: int, latency: float):
    """The listing server, in a process of its own: (process, endpoint)."""
    port = object_store_bench._free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port), str(objects), str(folders), str(latency)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, f"http://127.0.0.1:{port}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=200_000)
    ap.add_argument("--folders", type=int, default=100)
    ap.add_argument("--latency", type=float, default=0.05, help="seconds before each listing page is answered")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/tmp/shardkit-listing-bench")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    server, endpoint = serve(a.objects, a.folders, a.latency)
    env = dict(object_store_bench._env(endpoint), PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                          ".."))
    runs: dict = {}
    try:
        for r in range(a.rounds):
            ways = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))
            for name in ways:
                done = subprocess.run([sys.executable, "-c", TIMED.format(body=WAYS[name])], capture_output=True,
                                      text=True, env=env, cwd=a.work)  # cwd: sys.path's '' is not the checkout
                if done.returncode:
                    raise SystemExit(f"{name}: failed: {done.stderr.strip()}")
                got = json.loads(done.stdout.strip().splitlines()[-1])
                if got["n"] != a.objects:
                    raise SystemExit(f"{name}: listed {got['n']} of {a.objects} objects")
                runs.setdefault(name, []).append(got)
                print(f"round {r + 1} {name:20s}: {got['n']} objects, wall {got['wall']:.2f} s, "
                      f"CPU {got['cpu']:.2f} s ({1e6 * got['cpu'] / got['n']:.0f} us per object)", flush=True)
    finally:
        server.kill()
        server.wait()
    med = {name: (statistics.median(x["wall"] for x in v), statistics.median(x["cpu"] for x in v))
           for name, v in runs.items()}
    one, many = med["one stream"], med["a stream per folder"]
    print(f"\nmedians of {a.rounds}: {a.objects} objects in {a.folders} folders, each page answered after "
          f"{a.latency * 1000:.0f} ms")
    print(f"  wall: one stream {one[0]:.2f} s, a stream per folder {many[0]:.2f} s: {one[0] / many[0]:.1f}x as fast")
    print(f"  client CPU: {one[1]:.2f} s against {many[1]:.2f} s ({many[1] / one[1]:.2f}x)")


if __name__ == "__main__":
    main()
