"""The walk of SRC on a store (sources.walk over store.listing.Keys) finds what the walk of the same
folder on a disk finds: the same samples, row files, rejections and notes, on obstore, on s3fs's
pages and on any other fsspec store, across page boundaries, with a failing page retried; what only
a store can hold (keys with an empty folder name, folder markers) is counted, never a crash."""

from __future__ import annotations

import pytest
from moto_store import BUCKET, answers, s3  # noqa: F401 — s3, answers: the fixtures

import shardkit.sources.walk as W
from shardkit.sources.walk import walk
from shardkit.store import objstore

CLIENTS = ["obstore", "fsspec"] if objstore.available() else ["fsspec"]
# fsspec-ls: s3fs without its private _call_s3 (store.listing.S3_CALL), so its public ls, folder by folder
WALKS = CLIENTS + ["fsspec-ls"]

# A folder's files interleave with its subfolders' keys (a.jpg < a/x.jpg < a0.jpg); stems that prefix
# each other; two shardkit datasets whose first keys come before what proves them datasets; OUT
# inside SRC; hidden files and folders; a folder named like a file.
TREE = {
    "a.jpg": b"1", "a.txt": b"12", "a.b.jpg": b"123", "a/x.jpg": b"1234", "a/y.jsonl": b"{}\n", "a0.jpg": b"1",
    "cat/1.jpg": b"1", "cat/1.txt": b"1", "cat/2.png": b"1", "cat/2.jpg": b"1", "cat/z.xyz": b"1",
    "cat/.hidden.jpg": b"1", "cat/.git/config": b"1", "cat/.git/objects/ab": b"1", "cat/sub.jpg/inner.jpg": b"1",
    "old/aaa.jpg": b"1", "old/deep/q.jsonl": b"1", "old/manifest.json": b"{}", "old/shards/000000.tar": b"1",
    "old/zzz.jpg": b"1", "ds2/!early.jpg": b"1", "ds2/!early/x.parquet": b"1", "ds2/.shardkit/state": b"1",
    "ds2/later.jpg": b"1", "out/manifest.json": b"{}", "out/shards/000000.tar": b"1",
    "docs/d.jsonl": b"{}\n", "docs/notes.md": b"hi", "space name/\u00fc.jpg": b"1", "z.parquet": b"1",
    "dog/manifest.json": b"{}", "dog/1.jpg": b"1",  # a manifest.json without shards/: a sample like any
}


def _write(root, files: dict) -> str:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(root)


def _seen(listing) -> dict:
    """What a walk found, without the stamps (an mtime on a disk, an ETag on a store)."""
    table = listing.files.drop_columns(["stamp"]).sort_by("key").to_pylist()
    return {"files": table, "row_files": [(rf.id, rf.rel, rf.kind, rf.size, rf.stem_key, rf.top)
                                          for rf in listing.row_files],
            "rejections": sorted((r.path, r.stage, r.reason) for r in listing.rejections),
            "notes": sorted(listing.notes), "tops": listing.tops,
            "images": (listing.images, listing.top_images, listing.image_exts)}


@pytest.mark.parametrize("client", WALKS)
@pytest.mark.parametrize("page,switch", [(1000, None), (2, None), (2, 1), (3, 2)])
def test_a_store_walk_finds_what_the_disk_walk_finds(s3, tmp_path, monkeypatch, client, page, switch):
    """`switch`: the listing goes on as one stream per folder after that many pages (store.listing
    PARALLEL), skips and datasets met in folders listed so; None: one stream throughout."""
    import shardkit.store.listing as listing_module

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client.split("-")[0])
    monkeypatch.setattr(listing_module, "SWITCH", switch or 10 ** 9)
    monkeypatch.setattr(listing_module, "PARALLEL", 3)
    monkeypatch.setattr(listing_module, "FOLDER_KEYS", 0)  # a stream for any folder
    if client == "fsspec-ls":
        monkeypatch.setattr(listing_module, "S3_CALL", "_call_s3_renamed")
    monkeypatch.setattr(listing_module, "PAGE", page)  # s3fs's pages of 2 keys: skips across pages
    monkeypatch.setattr(objstore, "LIST_CHUNK", page)
    monkeypatch.setattr(W, "FLUSH_ROWS", page)  # a dataset's samples taken back from flushed batches too
    src = _write(tmp_path / "src", TREE)
    local = walk(src, src + "/out")
    url = s3.upload(src, "src")
    if client == "obstore" and switch is None:  # s3fs is never made for the listing of a small SRC
        monkeypatch.setattr(listing_module, "filesystem", lambda *a: pytest.fail("s3fs made for a listing"))
    remote = walk(url, s3.url("src/out"))
    assert _seen(remote) == _seen(local)
    reasons = {r.path: r.reason for r in local.rejections}
    assert reasons["old/"].startswith("a shardkit dataset") and reasons["ds2/"].startswith("a shardkit dataset")
    assert reasons["out/"].startswith("the build's output folder") and reasons["cat/.git/"].startswith("hidden")
    skipped = ("old/", "ds2/", "out/", "cat/.git/")
    assert not [r for r in local.rejections if r.path.startswith(skipped) and r.path not in skipped]
    assert "old" not in local.tops and "ds2" not in local.tops and "dog" in local.tops
    assert [rf.rel for rf in local.row_files] == ["a/y.jsonl", "docs/d.jsonl", "z.parquet"]


def test_any_other_fsspec_store_walks_as_the_disk(tmp_path):
    import fsspec

    src = _write(tmp_path / "src", TREE)
    fs = fsspec.filesystem("memory")
    fs.put(src + "/", "/walked/", recursive=True)
    try:
        assert _seen(walk("memory://walked", "memory://walked/out")) == _seen(walk(src, src + "/out"))
    finally:
        fs.rm("/walked", recursive=True)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("page", [1000, 2])
def test_keys_a_disk_cannot_name_and_folder_markers_are_counted_not_fatal(s3, monkeypatch, client, page):
    import shardkit.store.listing as listing_module

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    monkeypatch.setattr(listing_module, "PAGE", page)  # pages that end on a key obstore cannot name
    keys = {"src/": b"", "src/a.jpg": b"1", "src/b/.gitkeep": b"", "src/b/README": b"", "src/b/c.jpg": b"1",
            "src/odd//e.jpg": b"1", "src/odd//f.jpg": b"1", "src/odd/./f.jpg": b"1", "src/odd/g.jpg": b"1",
            "src/empty/": b"", "src/cat/": b"", "src/cat/1.jpg": b"1", "src/old/": b"", "src/old/_SUCCESS": b"",
            "src/old/manifest.json": b"{}", "src/old/sub/": b"", "src/old/shards/0.tar": b"1", "src/z.jpg": b"1"}
    for key, data in keys.items():
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=data)
    listing = walk(s3.url("src"))
    assert sorted(listing.files.column("key").to_pylist()) == ["a", "b/c", "cat/1", "odd/g", "z"]
    reasons = {r.path: r.reason for r in listing.rejections}
    assert sorted(reasons) == sorted(["b/.gitkeep", "b/README", "odd//e.jpg", "odd//f.jpg", "odd/./f.jpg", "old/"])
    assert reasons["b/.gitkeep"].startswith("hidden file") and reasons["b/README"].startswith("unsupported extension")
    assert all("empty, '.' or '..' folder name" in reasons[k] for k in ("odd//e.jpg", "odd//f.jpg", "odd/./f.jpg"))
    # SRC's own marker is not counted, and those of a dataset are taken back with it
    assert listing.notes == ["2 folder markers (keys that end in '/') passed over"]


KEYS_ROUND_A_MARKER = {"src/cat-dog/1.jpg": b"1", "src/cat.jpg": b"1", "src/cat/": b"", "src/cat/3.jpg": b"1",
                       "src/z.jpg": b"1"}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_listing_restarted_after_a_folder_marker_gives_each_key_once(s3, answers, monkeypatch, client):
    """object_store drops a marker's '/': `cat` would be the resume point, and `cat-dog/…` and
    `cat.jpg` (between `cat` and `cat/`) would come twice."""
    import shardkit.store.listing as listing_module
    from shardkit.store.remote import RemotePolicy

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    monkeypatch.setattr(listing_module, "PAGE", 3)
    monkeypatch.setattr(objstore, "LIST_CHUNK", 3)
    keys = {**KEYS_ROUND_A_MARKER, **({"src/a//x.jpg": b"1"} if client == "obstore" else {})}  # obstore: s3fs's page
    for key, data in keys.items():
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=data)
    answers[f"/{BUCKET}"] = [None, 503]  # the second listing request fails once: a restart
    listing = walk(s3.url("src"), policy=RemotePolicy(retries=2, backoff=0.01, fix="x"))
    assert sorted(listing.files.column("key").to_pylist()) == ["cat", "cat-dog/1", "cat/3", "z"]
    assert [r.path for r in listing.rejections] == (["a//x.jpg"] if client == "obstore" else [])
    assert listing.notes == ["1 folder markers (keys that end in '/') passed over"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("client", CLIENTS)
def test_a_skipped_folder_with_keys_past_its_end_point_ends(s3, monkeypatch, client):
    import shardkit.store.listing as listing_module

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    monkeypatch.setattr(listing_module, "PAGE", 1)
    monkeypatch.setattr(objstore, "LIST_CHUNK", 1)
    for key in ("src/z/.h/\U0010ffff.jpg", "src/z/.h/\U0010ffffb.jpg", "src/z/y.jpg"):
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=b"1")
    listing = walk(s3.url("src"))
    assert listing.files.column("key").to_pylist() == ["z/y"] and [r.path for r in listing.rejections] == ["z/.h/"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_failing_listing_page_is_retried_from_the_key_after_the_last_one(s3, answers, tmp_path, monkeypatch,
                                                                           client):
    import shardkit.store.listing as listing_module
    from shardkit.store.remote import RemoteError, RemotePolicy

    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    monkeypatch.setattr(listing_module, "PAGE", 2)
    src = s3.upload(_write(tmp_path / "src", {f"c{i}/{j}.jpg": b"1" for i in range(3) for j in range(3)}), "src")
    policy = RemotePolicy(retries=2, backoff=0.01, fix="shardkit build --timeout/--retries")
    answers[f"/{BUCKET}"] = [503] if client == "obstore" else [None, 503, None, 500]  # None: answered as usual
    assert sorted(walk(src, policy=policy).files.column("key").to_pylist()) == \
        [f"c{i}/{j}" for i in range(3) for j in range(3)]
    answers[f"/{BUCKET}"] = [503, 503, 503]
    with pytest.raises(RemoteError, match="tried 3 time"):
        walk(src, policy=policy)


@pytest.mark.skipif(not objstore.available(), reason="pip install 'shardkit[obstore]'")
def test_both_clients_give_the_same_stamps_so_a_rerun_on_the_other_rebuilds_nothing(s3, tmp_path, monkeypatch):
    src = s3.upload(_write(tmp_path / "src", TREE), "src")
    stamps = {}
    for client in ("obstore", "fsspec"):
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
        listing = walk(src, s3.url("src/out"))
        stamps[client] = (listing.files.select(["key", "stamp"]).sort_by("key").to_pylist(),
                          [rf.stamp() for rf in listing.row_files])
    assert stamps["obstore"] == stamps["fsspec"]


@pytest.mark.parametrize("client", CLIENTS)
def test_the_walk_tells_its_progress_as_it_goes(s3, tmp_path, monkeypatch, client):
    monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", client)
    monkeypatch.setattr(W, "SEEN_EVERY", 7)
    src = _write(tmp_path / "src", {f"c{i % 3}/{i}.jpg": b"1" for i in range(30)})
    on_disk, on_store = [], []
    walk(src, seen=on_disk.append)
    walk(s3.upload(src, "src"), seen=on_store.append)
    assert sorted(on_disk) == [0, 10, 10, 10]  # a folder at a time (SRC itself holds no file)
    assert on_store == [7, 7, 7, 7, 2]  # SEEN_EVERY keys at a time, then the rest


def test_taking_rows_back_keeps_the_rest_and_costs_what_it_takes_back(monkeypatch):
    import random

    monkeypatch.setattr(W, "FLUSH_ROWS", 5)
    rng = random.Random(7)
    for trial in range(200):
        cols, kept = W._Columns(), []
        for step in range(60):
            if rng.random() < 0.8:
                key = f"k{step}"
                cols.add(key, [key], None, 1, 1, step)
                kept.append(key)
            else:
                n = rng.randint(max(0, len(kept) - 7), len(kept))
                batches = len(cols.batches)
                cols.truncate(n)
                del kept[n:]
                assert len(cols.batches) <= batches  # no batch made to take rows back
        assert cols.table().column("key").to_pylist() == kept and cols.rows == len(kept)


@pytest.mark.skipif(not objstore.available(), reason="pip install 'shardkit[obstore]'")
def test_a_restart_on_obstore_tells_a_marker_from_a_file_of_its_name(s3, monkeypatch):
    """`cat` (an empty file) and `cat/` (a marker) both exist; a skip of `cat-a/.h/` restarts the
    stream between them: the marker, which object_store gives as `cat`, is still a marker."""
    monkeypatch.setattr(objstore, "LIST_CHUNK", 1)
    for key, data in {"src/cat": b"", "src/cat-a/.h/1.jpg": b"1", "src/cat-a/.h/2.jpg": b"1", "src/cat/": b"",
                      "src/cat/1.jpg": b"1", "src/v1.0/": b"", "src/sub.jpg/": b"", "src/sub.jpg/x.jpg": b"1"}.items():
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=data)
    listing = walk(s3.url("src"))
    assert sorted(listing.files.column("key").to_pylist()) == ["cat/1", "sub_jpg/x_9d6c9ff8"]
    assert sorted(r.path for r in listing.rejections) == ["cat", "cat-a/.h/"]
    assert listing.notes[-1] == "3 folder markers (keys that end in '/') passed over"  # cat/, v1.0/, sub.jpg/


@pytest.mark.timeout(60)
@pytest.mark.skipif(not objstore.available(), reason="pip install 'shardkit[obstore]'")
def test_a_page_of_s3fs_holding_only_src_s_own_marker_moves_on(s3, monkeypatch):
    import shardkit.store.listing as listing_module

    monkeypatch.setattr(listing_module, "PAGE", 1)
    for key, data in {"src/": b"", "src/a//b.jpg": b"1", "src/c.jpg": b"1"}.items():
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=data)
    listing = walk(s3.url("src"))
    assert listing.files.column("key").to_pylist() == ["c"] and [r.path for r in listing.rejections] == ["a//b.jpg"]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("page", [1000, 2])
def test_a_folder_s_files_and_subfolders_and_its_removal_are_the_same_on_both_clients(s3, monkeypatch, client,
                                                                                        page):
    """OUT's clean-up calls (list_folder, has_any, remove_tree) on obstore as on s3fs: one level
    of the folder (a subfolder once, a marker as a subfolder), a sibling that shares the prefix not
    counted as inside, and every key below removed, a page per bulk DELETE."""
    import shardkit.store.listing as L
    from shardkit import store
    from shardkit.store.listing import has_any, list_folder

    monkeypatch.setattr(L, "PAGE", page)
    monkeypatch.setattr(objstore, "LIST_CHUNK", page)
    if client == "fsspec":
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    for key in ("f/a.json", "f/b/1", "f/b/2", "f/b/c/3", "f/b0.json", "f/m/", "f/z.json", "f-sibling/x", "solo"):
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=b"" if key.endswith("/") else key.encode())
    assert [(e.name, e.is_dir, e.size) for e in list_folder(s3.url("f"))] == [
        ("a.json", False, 8), ("b", True, 0), ("b0.json", False, 9), ("m", True, 0), ("z.json", False, 8)]
    assert store.listdir(s3.url("f/b")) == {"1": 5, "2": 5}
    assert list(list_folder(s3.url("none"))) == []
    assert has_any(s3.url("f/b")) and has_any(s3.url("f/b/")) and has_any(s3.url("solo"))
    assert not has_any(s3.url("f-s")) and not has_any(s3.url("f/b/c/3") + "/") and not has_any(s3.url("none"))
    store.remove_tree(s3.url("f"))
    store.remove_tree(s3.url("none"))  # nothing there: fine
    assert s3.keys("f") == [] and s3.keys("f-sibling") == ["x"] and has_any(s3.url("solo"))


@pytest.mark.parametrize("client", CLIENTS)
def test_what_obstore_cannot_name_is_checked_and_removed_through_fsspec(s3, monkeypatch, client):
    """A first page holding a key object_store cannot name ('a//b'), a folder's own marker: has_any
    answers and remove_tree leaves nothing, on both clients; a missing bucket is nothing to remove."""
    from shardkit import store
    from shardkit.store.listing import has_any

    if client == "fsspec":
        monkeypatch.setenv("SHARDKIT_OBJECT_CLIENT", "fsspec")
    for key in ("u/a//b", "t/", "t/x", "t/sub/", "t/sub/y", "t/a//b", "t/c"):
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=b"" if key.endswith("/") else key.encode())
    assert has_any(s3.url("u")) and has_any(s3.url("t"))
    store.remove_tree(s3.url("t"))
    store.remove_tree(s3.url("u"))
    store.remove_tree("s3://no-such-bucket-here/t")
    assert s3.client.list_objects_v2(Bucket=BUCKET).get("Contents", []) == []
    assert not has_any(s3.url("t"))
