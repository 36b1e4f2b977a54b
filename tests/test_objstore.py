"""The lean s3:// client (store.objstore, obstore): taken when installed, fsspec when hidden, the same
bytes either way, errors as fsspec's, and no secret in anything written or printed."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from moto_store import answers, raw, s3, same_files  # noqa: F401 — s3, answers, raw: the fixtures

from shardkit import store
from shardkit.cli import main
from shardkit.config import BuildConfig
from shardkit.jobs.build import build
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset
from shardkit.store import objstore

pytestmark = pytest.mark.skipif(not objstore.available(), reason="pip install 'shardkit[obstore]'")
OPTIONS = dict(workers=0, image_size=48, progress=False, max_samples_per_shard=6)
SECRET = "fake-secret-7f3a9c-never-shown"


@pytest.fixture
def counted(monkeypatch):
    """{'get': n, 'put': n}: obstore requests made by this process (sync and async calls)."""
    import obstore

    calls = {"get": 0, "put": 0}
    for name in ("get", "get_async", "put", "put_async"):
        def wrapped(*args, _real=getattr(obstore, name), _kind=name.split("_")[0], **kwargs):
            calls[_kind] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(obstore, name, wrapped)
    return calls


def test_store_calls_take_obstore_when_installed_and_fsspec_when_told(s3, monkeypatch, counted):
    url = s3.url("a/b.bin")
    store.write(url, b"x" * 1000)
    assert store.read(url) == b"x" * 1000 and store.read_source(url, 10, 20) == b"x" * 10
    assert store.size(url) == 1000 and store.stat_source(url)[0] == 1000
    assert counted == {"get": 2, "put": 1}
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    store.write(url, b"y" * 10)
    assert store.read(url) == b"y" * 10
    assert counted == {"get": 2, "put": 1}


def test_the_version_of_a_source_is_the_same_on_both_clients(s3, monkeypatch):
    url = s3.url("v.bin")
    store.write(url, b"v" * 100)
    on_obstore = store.stat_source(url)
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    assert store.stat_source(url) == on_obstore  # a rerun after switching rebuilds nothing


def test_a_batch_of_sources_comes_in_order_with_errors_in_place(s3, counted):
    urls = [s3.url(f"many/{i:03d}") for i in range(3 * objstore.WINDOW)]
    for i, url in enumerate(urls):
        store.write(url, os.urandom(100 + i))
    expected = [store.read(u) for u in urls]
    counted["get"] = 0
    got = store.read_sources(urls + [s3.url("many/missing")] + urls[:2])
    assert got[:len(urls)] == expected and got[-2:] == expected[:2]
    missing = got[len(urls)]
    assert isinstance(missing, store.RemoteError) and missing.not_found and s3.url("many/missing") in str(missing)
    assert counted["get"] >= len(urls) + 3  # all through obstore (the missing one read again, alone)


def test_a_missing_object_and_a_missing_bucket_say_so_as_before(s3):
    with pytest.raises(FileNotFoundError):
        store.read(s3.url("nothing/here"))
    with pytest.raises(store.RemoteError, match=r"cannot read s3://no-such-bucket/x: .*not retried"):
        store.read_source("s3://no-such-bucket/x")


def test_build_s3_to_s3_on_obstore_is_byte_identical_to_local_and_to_fsspec(raw, tmp_path, s3, monkeypatch, counted):
    local = build(BuildConfig(raw, str(tmp_path / "local"), **OPTIONS))
    src = s3.upload(raw, "raw")
    remote = build(BuildConfig(src, s3.url("out"), **OPTIONS))
    assert remote.samples == local.samples and counted["get"] > 0 and counted["put"] > 0
    assert same_files(str(tmp_path / "local"), s3.download("out", str(tmp_path / "got"))) == []
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    build(BuildConfig(src, s3.url("out-fsspec"), **OPTIONS))
    assert same_files(str(tmp_path / "local"), s3.download("out-fsspec", str(tmp_path / "got-fsspec"))) == []


def test_a_fake_secret_never_appears_in_output_or_written_files(raw, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # moto does not check signatures
    objstore.forget()
    src = s3.upload(raw, "raw")
    runner = CliRunner()
    ok = runner.invoke(main, ["build", src, s3.url("out"), "--workers", "0", "--no-progress", "--image-size", "48"])
    bad = runner.invoke(main, ["build", "s3://no-such-bucket/raw", str(tmp_path / "out2"), "--workers", "0",
                               "--no-progress", "--retries", "0"])
    assert ok.exit_code == 0, ok.output
    assert bad.exit_code != 0 and "no-such-bucket" in bad.output + bad.stderr
    assert SECRET not in ok.output + ok.stderr + bad.output + bad.stderr
    local = s3.download("out", str(tmp_path / "got"))
    for folder in (local, str(tmp_path / "out2")):
        for d, _, names in os.walk(folder):
            for name in names:
                with open(os.path.join(d, name), "rb") as f:
                    assert SECRET.encode() not in f.read(), name


def test_a_process_forked_after_a_request_uses_fsspec(s3):
    store.write(s3.url("f.bin"), b"f")
    assert objstore.serves(s3.url("f.bin"))
    pid = os.fork()
    if pid == 0:  # obstore's runtime did not come along: a request here would hang
        code = 1
        try:
            code = 0 if not objstore.serves(s3.url("f.bin")) and store.read(s3.url("f.bin")) == b"f" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_500_and_503_are_retried_within_retries_then_one_line_naming_the_url(s3, answers, monkeypatch, client):
    from shardkit.store.remote import RemotePolicy

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)  # the same tries and the same message on both
    policy = RemotePolicy(retries=2, backoff=0.01, fix="shardkit build --timeout/--retries")
    url = s3.url("flaky.bin")
    store.write(url, b"z" * 50, policy)
    answers["/shardkit-test/flaky.bin"] = [503, 500]
    assert store.read(url, policy) == b"z" * 50  # two failures, the third try passes
    answers["/shardkit-test/flaky.bin"] = [503, 503, 503]
    with pytest.raises(store.RemoteError) as e:
        store.read(url, policy)
    message = str(e.value)
    assert message.startswith(f"cannot read {url}: ") and "\n" not in message  # s3fs says "OSError: [Errno 16]"
    assert "Service Unavailable (tried 3 time(s)" in message and "--timeout/--retries allow a slower store" in message
    answers["/shardkit-test/flaky.bin"] = [403]
    with pytest.raises(store.RemoteError, match="not retried"):
        store.read(url, policy)


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_policy_passed_to_a_verb_is_the_one_its_calls_follow(s3, answers, monkeypatch, client):
    from shardkit.store.remote import RemotePolicy

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    url = s3.url("argued.bin")
    store.write(url, b"a" * 50)
    answers["/shardkit-test/argued.bin"] = [503, 503]
    mine = RemotePolicy(retries=1, backoff=0.01, fix="mine --timeout")
    with pytest.raises(store.RemoteError) as e:
        store.read(url, mine)  # JOB_POLICY's 2 retries (no policy passed) would pass; this policy's 1 does not
    assert "tried 2 time(s)" in str(e.value) and "mine --timeout allow a slower store" in str(e.value)
    answers["/shardkit-test/argued.bin"] = [503]
    assert store.read_source(url, policy=mine) == b"a" * 50


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_stalled_get_fails_within_the_bound_naming_the_url(s3, answers, monkeypatch, client):
    from shardkit.store.remote import RemotePolicy

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    policy = RemotePolicy(timeout=1, retries=1, backoff=0.01, fix="shardkit build --timeout/--retries")
    url = s3.url("stalled.bin")
    store.write(url, b"s" * 50, policy)
    answers["/shardkit-test/stalled.bin"] = ["stall", "stall"]
    with pytest.raises(store.RemoteError) as e:
        store.read_source(url, policy=policy)
    message = str(e.value)
    assert message.startswith(f"cannot read {url}: ") and "tried 2 time(s)" in message and "timeout 1 s" in message


def test_without_a_region_the_bucket_s_own_is_asked_for(monkeypatch):
    import urllib.error
    import urllib.request
    from email.message import Message

    asked = []

    def urlopen(request, timeout):
        asked.append(request.full_url)
        headers = Message()
        headers["x-amz-bucket-region"] = "eu-west-3"
        raise urllib.error.HTTPError(request.full_url, 403, "Forbidden", headers, None)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(objstore, "_REGIONS", {})
    assert objstore._with_region({}, "photos", 1.0) == {"region": "eu-west-3"}
    assert objstore._with_region({"region": "us-west-2"}, "photos", 1.0) == {"region": "us-west-2"}
    local = {"endpoint": "http://127.0.0.1:9"}
    assert objstore._with_region(local, "photos", 1.0) == local
    assert asked == ["https://photos.s3.amazonaws.com/"]


def test_a_bucket_s_region_is_asked_once_per_process_and_a_forked_child_keeps_it(monkeypatch):
    """A worker makes a store per kind of call (bounded or not, each timeout), and its first batch's
    threads ask for them at once: the region is asked of AWS once (a round trip and a TLS handshake
    before the first GET), by none of them again, nor by a process forked after; an answer without
    one (AWS unreachable) is not kept."""
    import multiprocessing
    import threading
    import time
    import urllib.request
    from email.message import Message

    asked = []

    class Answer:
        def __init__(self, region):
            self.headers = Message()
            if region:
                self.headers["x-amz-bucket-region"] = region

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def urlopen(request, timeout):
        asked.append(request.full_url)
        time.sleep(0.05)  # the threads below all ask meanwhile
        return Answer("ap-south-2" if "photos" in request.full_url else None)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(objstore, "_REGIONS", {})
    got = []
    threads = [threading.Thread(target=lambda t=t: got.append(objstore._with_region({}, "photos", t)))
               for t in (1.0, 2.0, 1.0, 5.0, 1.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [{"region": "ap-south-2"}] * 6 and asked == ["https://photos.s3.amazonaws.com/"]
    assert objstore._with_region({}, "nowhere", 1.0) == {"region": "us-east-1"}  # unreachable: the default...
    assert objstore._with_region({}, "nowhere", 1.0) == {"region": "us-east-1"}
    assert asked.count("https://nowhere.s3.amazonaws.com/") == 2  # ...not kept: asked again
    if "fork" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=lambda: out.put((objstore._with_region({}, "photos", 1.0), len(asked))))
        child.start()
        assert out.get(timeout=30) == ({"region": "ap-south-2"}, 3)  # the child did not ask
        child.join()


def _at_once(n: int, call) -> list:
    """(outcome, seconds) of call() in n threads started together: 'ok' or the exception's type name."""
    import threading
    import time

    barrier, out = threading.Barrier(n), []

    def one(i):
        barrier.wait()
        began = time.monotonic()
        try:
            call(i)
            out.append(("ok", time.monotonic() - began))
        except Exception as e:  # noqa: BLE001 — what each thread got
            out.append((type(e).__name__, time.monotonic() - began))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _stores_made_by(monkeypatch, new_store) -> None:
    """objstore's stores emptied for a test (put back after it), each made by new_store()."""
    monkeypatch.setattr(objstore, "_new_store", new_store)
    monkeypatch.setitem(objstore._STATE, "stores", {})
    monkeypatch.setitem(objstore._STATE, "making", {})
    monkeypatch.setitem(objstore._STATE, "ran_in", objstore._STATE["ran_in"])


def test_threads_that_ask_for_one_store_at_once_make_it_once(monkeypatch):
    """A first batch's threads ask for the store of a bucket together: one makes it, the others
    wait for it (each made its own: a credential chain and a region each)."""
    import time

    made, got = [], []

    def new_store(protocol, bucket, timeout, total):
        made.append((protocol, bucket, total))
        time.sleep(0.05)
        return object()

    _stores_made_by(monkeypatch, new_store)
    out = _at_once(8, lambda i: got.append(objstore._store("s3://one-bucket/a/b.tar", 15.0, bounded=i % 2 == 0)))
    assert [k for k, _ in out] == ["ok"] * 8 and len(made) == 2  # one bounded, one not
    assert len({id(s) for s, _ in got}) == 2 and {k for _, k in got} == {"a/b.tar"}


def test_a_store_that_cannot_be_made_fails_every_thread_that_waited_for_it_at_once(monkeypatch):
    """A credential chain that takes its time to find no credentials (boto3 tries the instance's
    metadata service): the threads that asked meanwhile share its failure, not each run it again."""
    import time

    from botocore.exceptions import NoCredentialsError

    tries = []

    def new_store(protocol, bucket, timeout, total):
        tries.append(1)
        time.sleep(0.5)
        raise NoCredentialsError()

    _stores_made_by(monkeypatch, new_store)
    out = _at_once(6, lambda i: objstore._store("s3://no-credentials/a", 15.0))
    assert [k for k, _ in out] == ["NoCredentialsError"] * 6 and len(tries) == 1
    assert max(t for _, t in out) < 1.5  # one making (0.5 s), not six in turn (3 s)
    with pytest.raises(NoCredentialsError):  # a later call tries again
        objstore._store("s3://no-credentials/a", 15.0)
    assert len(tries) == 2


def test_an_unanswered_region_is_shared_by_the_stores_that_waited_and_other_buckets_do_not_wait(monkeypatch):
    """AWS unreachable (each HEAD waits its timeout): the bounded and the unbounded store of a
    bucket, made at once, wait one timeout between them; another bucket's question does not queue
    behind it."""
    import time
    import urllib.request

    asked = []

    def urlopen(request, timeout):
        asked.append(request.full_url)
        if "slow" in request.full_url:
            time.sleep(1.5)
            raise OSError("timed out")
        raise OSError("unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(objstore, "_REGIONS", {})
    monkeypatch.setitem(objstore._STATE, "asking", {})
    out = _at_once(3, lambda i: objstore._with_region({}, "slow-bucket" if i < 2 else "quick-bucket", 1.0))
    assert [k for k, _ in out] == ["ok"] * 3
    assert asked.count("https://slow-bucket.s3.amazonaws.com/") == 1
    # the quick bucket within half the slow wait; the slow one waited once (1.5 s), not twice (3 s)
    assert sorted(t for _, t in out)[0] < 0.75 and max(t for _, t in out) < 2.7


def test_a_build_on_obstore_never_builds_the_fsspec_client_for_its_reads_and_uploads(raw, tmp_path, s3,
                                                                                     monkeypatch, counted):
    """A worker process of an s3 -> s3 build reads sources and uploads shards: all on obstore, with no
    fsspec filesystem made behind the client (an attribute lookup falling through to it once made s3fs
    and botocore in every worker for nothing)."""
    src = s3.upload(raw, "raw")
    fell = []
    real = objstore.Client.__getattr__
    monkeypatch.setattr(objstore.Client, "__getattr__", lambda self, name: fell.append(name) or real(self, name))
    with store.writer(s3.url("up/a.bin")) as f:  # the staged-file upload a shard takes
        f.write(b"z" * 5000)
    assert store.read(s3.url("up/a.bin")) == b"z" * 5000
    assert fell == [] and counted["put"] == 1
    build(BuildConfig(src, s3.url("out"), **OPTIONS))
    assert counted["put"] > 1 and counted["get"] > 0
    assert set(fell) <= {"rm"}, fell  # only the driver's removal of a whole folder stays on fsspec


READ_WITH_WORKERS = """
import json, os, sys
import obstore
from shardkit.store import objstore
from shardkit.loader import make_loader
from shardkit.reader.dataset import StreamingDataset

url, cache, log = sys.argv[1:4]
real = obstore.get
def get(*args, **kwargs):  # every GET obstore makes, by process (the workers inherit this)
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    return real(*args, **kwargs)
obstore.get = get
ds = StreamingDataset(url, cache_dir=cache, seed=1)
keys = [k for b in make_loader(ds, batch_size=4, num_workers=2) for k in b["__key__"]]
started = objstore._STATE["ran_in"]
alone = StreamingDataset(url, cache_dir=cache + "-alone", seed=1)  # no workers: the main process reads the epoch
keys_alone = [k for b in make_loader(alone, batch_size=4, num_workers=0) for k in b["__key__"]]
print(json.dumps({"main": os.getpid(), "started_here": started, "keys": keys, "keys_alone": keys_alone,
                  "started_alone": objstore._STATE["ran_in"]}))
"""


def test_a_training_scripts_workers_read_s3_through_obstore_its_main_process_never_starts_it(s3, tmp_path):
    """obstore's runtime does not survive a fork: had the main process started it (reading the
    manifest, fetching the first batches' indexes), every DataLoader worker would read through s3fs."""
    import json
    import subprocess
    import sys

    from factory import make_dataset

    root, _ = make_dataset(tmp_path / "ds", 40, shards=4, fields=("raw", "cls"))
    url = s3.upload(root, "sets/forked")
    log = tmp_path / "gets.log"
    log.touch()
    out = subprocess.run([sys.executable, "-c", READ_WITH_WORKERS, url, str(tmp_path / "cache"), str(log)],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    local = [k for b in make_loader(StreamingDataset(root, seed=1), batch_size=4, num_workers=2) for k in b["__key__"]]
    assert got["keys"] == local  # the same samples in the same order
    assert got["started_here"] is None  # no obstore request in the main process
    readers = log.read_text().split()
    # the workers' GETs went through obstore, and, with no workers, the main process's own epoch's
    assert set(readers) - {str(got["main"])} and got["started_alone"] == got["main"] and str(got["main"]) in readers
    local_alone = [k for b in make_loader(StreamingDataset(root, seed=1), batch_size=4, num_workers=0)
                   for k in b["__key__"]]
    assert got["keys_alone"] == local_alone


def test_an_upload_takes_the_part_size_and_concurrency_it_is_given(s3, tmp_path, monkeypatch):
    """store._upload passes s3fs's keywords (chunksize, max_concurrency): obstore's client uses them,
    so one bound on an upload's memory holds on both clients."""
    import obstore

    asked, real = [], obstore.put_async

    async def put_async(store_, key, data, **kwargs):
        asked.append((kwargs.get("chunk_size"), kwargs.get("max_concurrency")))
        return await real(store_, key, data, **kwargs)

    monkeypatch.setattr(obstore, "put_async", put_async)
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(6 << 20))
    fs = objstore.Client(s3.url("up/big.bin"), 15.0, lambda: None)
    fs.put_file(str(source), s3.url("up/big.bin"), chunksize=5 << 20, max_concurrency=2)
    fs.put_file(str(source), s3.url("up/again.bin"))
    assert asked == [(5 << 20, 2), (store.UPLOAD_PART, store.UPLOAD_CONCURRENCY)]
    assert store.read(s3.url("up/big.bin")) == source.read_bytes() == store.read(s3.url("up/again.bin"))


EXIT_AFTER_A_BATCH = r"""
import gc, sys, threading, time
from shardkit import store
from shardkit.store import objstore

url = sys.argv[1]
store.write(url, b"x" * 100)
loop = objstore._loop()


def tick():  # the loop wakes every millisecond: a result handed to it runs before the hand-off's own wake-up
    loop.call_later(0.001, tick)


loop.call_soon_threadsafe(tick)
real = loop._write_to_self


def slow_wake_up():  # the runtime's thread that handed the result over is slow to leave (a loaded machine)
    if threading.current_thread() is not threading.main_thread() and threading.current_thread().name != "shardkit-objstore":
        time.sleep(0.3)
    real()


class SlowToCollect:  # the finalizing interpreter's last collection takes a while (a build's client: a large heap)
    def __del__(self, _sleep=time.sleep):
        _sleep(0.6)


loop._write_to_self = slow_wake_up
assert objstore.fetch_many([url], 15.0).result() == [b"x" * 100]
gc.set_threshold(0)  # no collection until the finalizing interpreter's own
slow = SlowToCollect()
slow.cycle = slow
del slow
print("fetched", flush=True)
"""


def test_the_process_exits_cleanly_while_a_runtime_thread_is_still_handing_a_result_over(s3, tmp_path):
    """A runtime (Rust) thread hands each async result to the loop holding the GIL, and lets go of it
    in the loop's wake-up write; had the interpreter finalized meanwhile, that thread would have been
    ended as it took the GIL back, and the process aborted (SIGABRT after its last line, seen once in
    ~30 runs of a build under load). The exit waits for it."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", EXIT_AFTER_A_BATCH, s3.url("exit/x.bin")], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert (out.returncode, out.stdout) == (0, "fetched\n"), out.stderr[-2000:]


def test_a_head_and_a_delete_are_made_in_the_caller_s_thread(s3, monkeypatch):
    """Neither goes through the event loop: a process whose last call is a DELETE (the lease's
    release) leaves no runtime thread on its way back to Python as it exits."""
    def no_loop():
        raise AssertionError("a HEAD or a DELETE went through the loop")

    monkeypatch.setattr(objstore, "_loop", no_loop)
    url = s3.url("sync/x.bin")
    store.write(url, b"y" * 10)
    assert store.size(url) == 10
    store.remove(url)
    assert store.size(url) is None


def test_a_build_and_its_reruns_on_obstore_never_make_the_fsspec_filesystem(raw, s3, monkeypatch):
    """The client's own calls too: the check of SRC, the lease (conditional PUTs), OUT's listings and
    clean-up, the reuse of a rerun. s3fs and botocore (~0.4 CPU-s of a process) are never built."""
    from shardkit.store import calls

    src, out = s3.upload(raw, "raw"), s3.url("out")

    def refused(url, policy=None):
        raise AssertionError(f"fsspec's filesystem made for {url}")

    monkeypatch.setattr(calls, "_filesystem", refused)
    first = build(BuildConfig(src, out, **OPTIONS))
    assert build(BuildConfig(src, out, **OPTIONS)).reused_shards == len(first.shards)
    with open(os.path.join(raw, "dog", "000002.jpg"), "rb") as f:
        s3.fs.pipe(s3.url("raw/cat/000002.jpg").split("://", 1)[1], f.read())  # the test's own s3fs, not the build's
    changed = build(BuildConfig(src, out, **OPTIONS))
    assert changed.reused_shards == len(first.shards) - 1 and "lease" not in s3.keys("out/.shardkit")


def test_a_source_with_a_key_obstore_cannot_name_builds_as_on_fsspec(raw, s3):
    """'raw/zz//odd.jpg' in the first page of SRC: the check that SRC holds anything reads that page
    through fsspec, and the key is a counted rejection, as the walk counts it."""
    src = s3.upload(raw, "raw")
    s3.client.put_object(Bucket=s3.url("").split("/")[2], Key="raw/zz//odd.jpg", Body=b"not an image")
    result = build(BuildConfig(src, s3.url("out"), **OPTIONS))
    assert result.samples > 0 and any("zz//odd.jpg" in r.path for r in result.rejections)


LATE_EXIT_HANDLER = r"""
import atexit, sys, time
from shardkit import store

url = sys.argv[1]


def bye():  # registered before objstore is imported (by the first call): it runs after objstore's _quiet
    from shardkit.store import objstore

    assert objstore._STATE["closing"]
    store.write(url + ".bye", b"bye")
    store.read(url + ".bye")
    objstore.WHOLE = 10  # url's 100 bytes: a GET of the batch read on the loop, from a thread of the pool
    t = time.monotonic()
    assert store.read_sources([url + ".bye", url]) == [b"bye", b"x" * 100]
    print("bye", round(time.monotonic() - t), flush=True)


atexit.register(bye)
store.write(url, b"x" * 100)
"""


def test_an_exit_handler_registered_before_the_client_may_still_call_the_store(s3, tmp_path):
    """Exit handlers run in reverse order: one registered before objstore was imported runs after
    the exit began (_quiet). The main thread's calls still go on; nothing hangs."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LATE_EXIT_HANDLER, s3.url("late/x")], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert (out.returncode, out.stdout) == (0, "bye 0\n"), out.stderr[-2000:]  # the batch at once, not re-read
    assert store.read(s3.url("late/x.bye")) == b"bye"


def test_calls_in_many_threads_never_refuse_each_other(s3):
    """Counting the calls in (for the exit) never turns one away while the process runs: sync HEADs
    and bare counted calls in 8 threads beside async batches on the loop."""
    import threading

    urls = [s3.url(f"race/{i}") for i in range(32)]
    for u in urls:
        store.write(u, b"x" * 100)
    stop = threading.Event()

    def heads(i):
        while not stop.is_set():
            objstore.is_object(urls[i], 15.0)

    def entering():  # a call counted in and out as fast as can be: the narrowest window there is
        while not stop.is_set():
            with objstore._busy():
                pass

    threads = [threading.Thread(target=heads, args=(i,)) for i in range(6)]
    threads += [threading.Thread(target=entering) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        got = [objstore.fetch_many(urls, 15.0).result() for _ in range(10)]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert all(batch == [b"x" * 100] * len(urls) for batch in got)
    assert objstore._STATE["busy"] == 0


def test_a_store_that_answers_a_put_without_an_etag_is_told_to_use_fsspec(s3, monkeypatch):
    """object_store refuses a PUT's answer without an ETag (an S3-compatible store may leave it
    off): one error, not retried, that says how to go on (s3fs takes such a store)."""
    from moto.server import DomainDispatcherApplication

    real = DomainDispatcherApplication.__call__

    def answer(self, environ, start_response):
        if environ["REQUEST_METHOD"] != "PUT":
            return real(self, environ, start_response)

        def without_etag(status, headers, *rest):
            return start_response(status, [(k, v) for k, v in headers if k.lower() != "etag"], *rest)

        return real(self, environ, without_etag)

    monkeypatch.setattr(DomainDispatcherApplication, "__call__", answer)
    with pytest.raises(store.RemoteError, match="SHARDKIT_OBJECT_CLIENT=fsspec") as e:
        store.write(s3.url("no-etag/x"), b"x")
    assert "not retried" in str(e.value)
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    store.write(s3.url("no-etag/x"), b"y")
    assert store.read(s3.url("no-etag/x")) == b"y"


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_source_file_reads_as_its_bytes_across_blocks_seeks_and_a_failed_get(s3, answers, monkeypatch, client):
    """store.open_source on both clients (obstore: ranged GETs of a block at a time): reads that
    span blocks, are larger than one, start past the end or at it (SEEK_END), give the object's
    bytes; a GET answered 503 is retried where the read stopped, and the size stays known."""
    import io
    import random

    from shardkit.store import source

    if client == "fsspec":
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    monkeypatch.setattr(source._Ranged, "BLOCK", 1000)
    data = random.Random(3).randbytes(10_007)
    url = s3.url("src/blob.bin")
    store.write(url, data)
    want, rnd = io.BytesIO(data), random.Random(5)
    with store.open_source(url) as got:
        assert got.size == len(data)
        answers[f"/{url.split('://', 1)[1]}"] = [503]  # the first GET of the bytes fails once
        for step in range(300):
            whence = rnd.choice([io.SEEK_SET, io.SEEK_CUR, io.SEEK_END])
            offset = rnd.randint(-1200, 1200) if whence != io.SEEK_SET else rnd.randint(0, 11_000)
            if whence == io.SEEK_END:
                offset = min(0, offset)
            assert got.seek(offset, whence) == want.seek(max(0, {0: 0, 1: want.tell(), 2: len(data)}[whence] + offset))
            n = rnd.choice([-1, 0, 1, 999, 1000, 1001, 2500])
            assert got.read(n) == want.read(n), step
        assert got.size == len(data) and answers[f"/{url.split('://', 1)[1]}"] == []  # the 503 was met
    ahead = []
    real = objstore.fetch_range
    monkeypatch.setattr(objstore, "fetch_range", lambda *a: ahead.append(a[1]) or real(*a))
    with store.open_source(url) as got:  # a stream from the start, in reads across the blocks' ends
        assert b"".join(iter(lambda: got.read(700), b"")) == data
    assert client == "fsspec" or ahead == list(range(1000, 10_007, 1000))  # each next block read ahead


FIRST_CALL_A_BATCH = r"""
import sys, time
from shardkit.store import objstore

assert objstore.fetch_many([sys.argv[1]], 15.0).result() == [b"first"]
time.sleep(0.05)  # the batch's own count is given back by a callback
print(objstore._STATE["busy"], flush=True)
"""


def test_a_batch_as_a_process_s_first_call_is_counted_in_and_out(s3, tmp_path):
    """The count of calls in flight starts with the process (a fork's or a fresh one's), not after a
    batch was counted in: it was reset under it, ended at -1, and every exit waited 5 s."""
    import subprocess
    import sys

    store.write(s3.url("first/x"), b"first")
    out = subprocess.run([sys.executable, "-c", FIRST_CALL_A_BATCH, s3.url("first/x")], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert (out.returncode, out.stdout) == (0, "0\n"), out.stderr[-2000:]


def test_once_the_exit_began_a_batch_starts_no_more_requests(s3, answers, monkeypatch):
    """A batch nobody waits for any more (a caller interrupted, an error elsewhere) must not go on
    fetching while the process exits: the loop starts none of its remaining GETs."""
    urls = [s3.url(f"late-batch/{i}") for i in range(4)]
    for url in urls:
        store.write(url, b"x")
    answers[f"/{urls[0].split('://', 1)[1]}"] = ["stall"]
    monkeypatch.setattr(objstore, "WINDOW", 1)  # one GET at a time: the first stalls
    future = objstore.fetch_many(urls, 1.0)
    monkeypatch.setitem(objstore._STATE, "closing", os.getpid())  # the exit begins (_quiet)
    got = future.result(timeout=30)
    assert isinstance(got[0], (TimeoutError, ConnectionError)), got  # stalled, or not started yet
    assert all(isinstance(g, ConnectionError) and "exiting" in str(g) for g in got[1:]), got


def test_each_batch_has_its_window_whatever_other_batches_hold(s3, answers, monkeypatch):
    """The pool's threads are shared by the process's batches, but a batch whose GETs all stall
    does not keep another batch waiting: the pool grows."""
    import threading
    import time

    monkeypatch.setattr(objstore, "WINDOW", 2)
    stalled = [s3.url(f"windows/stalled{i}") for i in range(2)]
    quick = [s3.url(f"windows/quick{i}") for i in range(6)]
    for url in stalled + quick:
        store.write(url, b"q")
    for url in stalled:
        answers[f"/{url.split('://', 1)[1]}"] = ["stall"]
    held = objstore.fetch_many(stalled, 30.0)
    time.sleep(0.3)  # its two GETs are in flight, and stalled
    got, t = [], time.monotonic()
    threads = [threading.Thread(target=lambda: got.append(objstore.fetch_many(quick, 30.0).result(timeout=20)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == [[b"q"] * 6] * 2 and time.monotonic() - t < 10
    assert not held.done()  # still stalled (released at the test's end)
    held.cancel()
