"""Tar headers streamed one by one (sources.tar_members) and counting a tar (sources.tars): what tarfile
reads from a clean tar, member data skipped and never held, a count that does not grow with samples."""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import asdict

import pytest

from shardkit.sample import make_key
from shardkit.sources import tar_members as T
from shardkit.sources.index import ScanOptions, keys_of, load_index
from shardkit.sources.tar_rows import tar_rows
from shardkit.sources.tars import count_tar
from shardkit.sources.walk import RowFile


def _tar(path, members, fmt=tarfile.PAX_FORMAT):
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


class _Counting(io.FileIO):
    """A file that records every read."""

    reads: list

    def read(self, n=-1):
        data = super().read(n)
        self.reads.append(len(data))
        return data


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_members_are_what_tarfile_reads_from_a_clean_tar(tmp_path, fmt):
    long = "d" * 60 + "/" + "k" * 90  # over 100 bytes: GNU long name, pax path, or ustar prefix
    names = [f"{long}.jpg", f"{long}.txt", "é/caf\u00e9.json", "a.b.c.seg.png", "empty.txt"]
    if fmt == tarfile.USTAR_FORMAT:
        names[2] = "plain/cafe.json"
    path = _tar(tmp_path / "t.tar", [(n, bytes([i]) * (i * 300)) for i, n in enumerate(names)], fmt)
    with tarfile.open(path) as tf:
        expected = [(m.name, m.offset_data, m.size) for m in tf.getmembers()]
    with open(path, "rb") as f:
        events = list(T.members(f, os.path.getsize(path)))
    assert [(m.name, m.data, m.size) for m in events] == expected
    assert all(isinstance(m, T.Member) and m.regular for m in events)


def test_counting_skips_member_data_and_holds_no_tar(tmp_path):
    big = os.urandom(200_000)
    path = _tar(tmp_path / "t.tar", [(f"{i:04d}.{ext}", big if ext == "jpg" else b"3")
                                      for i in range(40) for ext in ("cls", "jpg")])
    f = _Counting(path)
    f.reads = []
    with f:
        events = list(T.members(f, os.path.getsize(path)))
    assert len(events) == 80 and max(f.reads) <= T.BLOCK
    assert sum(f.reads) < os.path.getsize(path) / 50  # headers only: 40 x 200 KB of data never read


def _count(tmp_path, n: int):
    members = [(f"{i:06d}.{ext}", b"%d" % (i % 5)) for i in range(n) for ext in ("txt", "cls")]
    path = _tar(tmp_path / f"s{n}.tar", members)
    rf = RowFile(0, os.path.basename(path), "tar", os.path.getsize(path), 0, make_key(f"s{n}"), None)
    opts = ScanOptions(str(tmp_path), str(tmp_path / f"state{n}"))
    os.makedirs(opts.state_dir)
    return rf, opts, count_tar(rf, opts, os.path.join(opts.state_dir, "c"))


def test_a_count_does_not_grow_with_the_samples_of_its_tar(tmp_path):
    """What a counting task hands the client: a few numbers; the samples stay in files on the cluster."""
    small, large = _count(tmp_path, 10)[2], _count(tmp_path, 3000)[2]
    assert (small.rows, large.rows) == (10, 3000)
    assert abs(len(json.dumps(asdict(large))) - len(json.dumps(asdict(small)))) < 32
    assert large.tar["cls"] == {"samples": 3000, "max": 4}


def test_rows_come_in_key_order_whatever_the_member_order(tmp_path):
    path = _tar(tmp_path / "t.tar", [(f"{k}.txt", k.encode()) for k in ("b", "c", "a", "d/x")])
    rf = RowFile(0, "t.tar", "tar", os.path.getsize(path), 0, "t", None)
    opts = ScanOptions(str(tmp_path), str(tmp_path))
    count = count_tar(rf, opts, str(tmp_path / "c"))
    assert keys_of("t", count, 0, 4) == ["t/a", "t/b", "t/c", "t/d/x"]
    assert load_index(count)["number"].tolist() == [2, 0, 1, 3]  # each sample's place in the tar
    samples = [ref.make() for ref in tar_rows(opts, rf, count, 1, 4)]
    assert [(s.key, s.fields["txt"], s.meta["source"]) for s in samples] == [
        ("t/b", "b", "t.tar:b"), ("t/c", "c", "t.tar:c"), ("t/d/x", "d/x", "t.tar:d/x")]


def test_ambiguous_samples_are_rejected_by_reason(tmp_path):
    members = [("a.jpg", b"1"), ("b.txt", b"2"), ("a.txt", b"3"),  # a's members are apart
               ("c.jpg", b"4"), ("c.png", b"5"),  # two images
               ("d.cls", b"1"),  # a label alone
               ("e.txt", b"6"), ("e.txt", b"7"),  # one name twice
               ("f.txt", b"ok")]
    path = _tar(tmp_path / "t.tar", members)
    rf = RowFile(0, "t.tar", "tar", os.path.getsize(path), 0, "t", None)
    count = count_tar(rf, ScanOptions(str(tmp_path), str(tmp_path)), str(tmp_path / "c"))
    assert keys_of("t", count, 0, count.rows) == ["t/b", "t/f"]
    reasons = dict(count.tar["rejections"])
    assert sorted(reasons) == ["t.tar:a", "t.tar:c", "t.tar:d", "t.tar:e"]
    for path, start in [("t.tar:a", "ambiguous sample: key 'a' appears 2 times in the tar, apart"),
                        ("t.tar:c", "ambiguous sample: several images share the key 'c'"),
                        ("t.tar:d", "no content: only a cls member"),
                        ("t.tar:e", "ambiguous sample: two members named 'e.txt'")]:
        assert reasons[path].startswith(start), reasons[path]


def test_a_count_whose_files_are_gone_is_made_again(tmp_path):
    from shardkit.sources.rows import count_rows, counted

    path = _tar(tmp_path / "t.tar", [("a.txt", b"x"), ("b.txt", b"y")])
    rf = RowFile(0, "t.tar", "tar", os.path.getsize(path), 0, "t", None)
    opts = ScanOptions(str(tmp_path), str(tmp_path / "state"))
    first = count_rows(rf, opts)
    assert counted(rf, opts) == first
    os.remove(first.keys)
    assert counted(rf, opts) is None
    assert count_rows(rf, opts) == first and os.path.exists(first.keys)


def test_names_as_tar_cf_and_macos_tar_write_them(tmp_path):
    """`tar cf x.tar -C folder .` names members `./a.txt`; macOS tar adds `._a.txt`; webdataset skips
    `__meta__` members: keys as extracting would give them, the rest counted per reason."""
    members = [("./", b""), ("./a.txt", b"1"), ("./._a.txt", b"mac"), ("./sub/b.txt", b"2"), ("__index__.json", b"{}"),
               ("README", b"x")]
    with tarfile.open(tmp_path / "t.tar", "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE if name.endswith("/") else tarfile.REGTYPE
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    rf = RowFile(0, "t.tar", "tar", os.path.getsize(tmp_path / "t.tar"), 0, "t", None)
    opts = ScanOptions(str(tmp_path), str(tmp_path))
    count = count_tar(rf, opts, str(tmp_path / "c"))
    assert keys_of("t", count, 0, count.rows) == ["t/a", "t/sub/b"]
    assert [s.fields["txt"] for s in (ref.make() for ref in tar_rows(opts, rf, count, 0, 2))] == ["1", "2"]
    assert sorted(reason.split(",")[0] for _, reason in count.tar["rejections"]) == [
        "WebDataset metadata member", "hidden member", "no extension"]


def test_a_tar_is_counted_and_read_through_a_url_opener(tmp_path):
    """Counting and reading go through one opener (tars.open_source): a tar in an fsspec store is a
    seekable file object like a local one (here fsspec's memory filesystem)."""
    import fsspec

    path = _tar(tmp_path / "t.tar", [(f"{i:03d}.{ext}", b"%d" % i) for i in range(50) for ext in ("txt", "cls")])
    fs = fsspec.filesystem("memory")
    fs.pipe("/wds-src/sub/t.tar", path.read_bytes())
    try:
        rf = RowFile(0, "sub/t.tar", "tar", os.path.getsize(path), 0, "sub/t", "sub")
        opts = ScanOptions("memory://wds-src", str(tmp_path / "state"))
        os.makedirs(opts.state_dir)
        count = count_tar(rf, opts, str(tmp_path / "state" / "c"))
        samples = [ref.make() for ref in tar_rows(opts, rf, count, 10, 13, cls=True)]
        assert [(s.key, s.fields) for s in samples] == [
            (f"sub/t/{i:03d}", {"txt": str(i), "cls": i}) for i in range(10, 13)]
    finally:
        fs.rm("/wds-src", recursive=True)


def test_header_reads_what_tarfile_reads_and_fails_where_it_fails():
    import random

    rng = random.Random(0)
    alphabet = "abcXYZ019_-./é☃"
    seen = 0
    for _ in range(2000):
        info = tarfile.TarInfo("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 160))))
        info.type = rng.choice([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.AREGTYPE])
        info.size = 0 if info.type in (tarfile.DIRTYPE, tarfile.SYMTYPE) else rng.choice(
            [0, 1, 511, rng.randint(0, 10**9), 8**11 - 1, 8**11 + 5])
        fmt = rng.choice([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
        try:
            buf = info.tobuf(fmt, "utf-8", "surrogateescape")
        except ValueError:  # ustar cannot hold this name or size
            continue
        if rng.random() < 0.2:  # a flipped byte somewhere in the headers
            at = rng.randrange(len(buf))
            buf = buf[:at] + bytes([buf[at] ^ 0x10]) + buf[at + 1:]
        for i in range(0, len(buf), 512):
            block = buf[i:i + 512]
            if block.count(0) == 512:
                continue
            try:
                expected = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError:
                with pytest.raises(tarfile.HeaderError):
                    T.header(block)
                continue
            assert T.header(block) == (expected.name, expected.size, expected.type)
            seen += 1
    assert seen > 2000


def test_a_tar_that_changed_size_since_it_was_counted_is_not_read(tmp_path):
    rf, opts, count = _count(tmp_path, 5)
    assert [ref.make().fields["txt"] for ref in tar_rows(opts, rf, count, 0, 5)] == ["0", "1", "2", "3", "4"]
    with open(tmp_path / rf.rel, "ab") as f:
        f.write(bytes(1024))
    with pytest.raises(ValueError, match="s5.tar is no longer the size it was counted at"):
        list(tar_rows(opts, rf, count, 0, 5))
