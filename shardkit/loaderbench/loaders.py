"""The loaders compared: what a newcomer writes, WebDataset over the same tars, and shardkit's readers."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Callable

from shardkit.loaderbench.data import BenchData
from shardkit.meter import DataProfile


@dataclass(frozen=True)
class Variant:
    """`loader(data, workers, batch_size, pin)` returns batches (a DataLoader, so the meter sees
    num_workers); `split(batch)` returns the (uint8 Bx3xHxW images, int64 labels) every variant
    yields. A developer benchmark (bench/loader_bench.py) can import VARIANTS to measure the same code.
    """

    name: str
    loader: Callable  # (data, workers, batch_size, pin) -> iterable of batches
    split: Callable  # batch -> (images, labels)
    what: str
    data: DataProfile  # what the variant reads: the meter's advice depends on it


class RawFolderDataset:
    """Map-style Dataset over image files: PIL open, resize shorter side, center crop, every time.

    What a newcomer writes (torchvision's ImageFolder + Resize + CenterCrop, without torchvision).
    """

    def __init__(self, root: str, items, size: int):
        self.root, self.items, self.size = root, list(items), size
        self.resize = round(size * 256 / 224)  # the usual 256 -> 224 ratio

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        import numpy as np
        from PIL import Image

        rel, label = self.items[i]
        with Image.open(os.path.join(self.root, rel)) as im:
            im = im.convert("RGB")
            w, h = im.size
            scale = self.resize / min(w, h)
            im = im.resize((max(self.size, round(w * scale)), max(self.size, round(h * scale))),
                           Image.Resampling.BILINEAR)
            left, top = (im.size[0] - self.size) // 2, (im.size[1] - self.size) // 2
            im = im.crop((left, top, left + self.size, top + self.size))
            # HWC, as PIL gives it: the default collate stacks contiguous arrays with one memcpy
            # each; per-sample CHW views would make torch.stack do slow strided copies instead.
            return np.asarray(im), label


def _raw_folder(data: BenchData, workers: int, batch_size: int, pin: bool):
    from torch.utils.data import DataLoader

    ds = RawFolderDataset(data.raw_folder, data.items, data.image_size)
    # persistent_workers as shardkit's loader has them: a run of several epochs (a small folder)
    # must not charge one side for starting its workers again each epoch.
    return DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=pin,
                      collate_fn=hwc_collate, persistent_workers=workers > 0)


def wds_decode(sample: dict):
    """The usual WebDataset `.map`: PIL-decode the JPEG member (HWC uint8), parse the ASCII label."""
    from shardkit.reader.decode import decode_image

    return decode_image(sample["jpg"]), int(sample["cls"])


def hwc_collate(samples):
    """(HWC array, label) pairs -> (B,H,W,3) uint8 tensor, int64 labels: one np.stack per batch."""
    import numpy as np
    import torch

    images, labels = zip(*samples)
    return torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.int64)


def _webdataset(data: BenchData, workers: int, batch_size: int, pin: bool):
    import webdataset as wds
    from torch.utils.data import DataLoader

    urls = sorted(glob.glob(os.path.join(data.jpeg_root, "shards", "*.tar")))
    # Unshuffled so every variant reads the same samples; split over workers by shard (its default).
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(wds_decode).batched(
        batch_size, collation_fn=hwc_collate)
    return DataLoader(ds, batch_size=None, num_workers=workers, pin_memory=pin, persistent_workers=workers > 0)


def _shardkit(root_of: Callable, fmt: str, field: str):
    def loader(data: BenchData, workers: int, batch_size: int, pin: bool):
        from shardkit.loader import make_loader
        from shardkit.reader.dataset import StreamingDataset

        ds = StreamingDataset(root_of(data), format=fmt, shuffle=False, fields=[field, "cls"])
        return make_loader(ds, batch_size=batch_size, num_workers=workers, pin_memory=pin)

    return loader


def _hwc_split(batch):
    # A (B,3,H,W) view of the HWC batch: the same channels-last layout shardkit's loader yields.
    return batch[0].permute(0, 3, 1, 2), batch[1]


def _split(field: str):
    return lambda batch: (batch[field], batch["cls"])


def _mixture(data: BenchData, workers: int, batch_size: int, pin: bool):
    from shardkit.loader import make_loader
    from shardkit.reader.mixture import Mixture

    # The same JPEG samples in two sources (tar and Parquet shards), half the epoch from each: the
    # cost of mixing (two shard sets, per-source streams, the interleave) at the same bytes read.
    sources = {"tar": {"path": data.jpeg_root, "format": "tar", "weight": 0.5},
               "parquet": {"path": data.jpeg_root, "format": "parquet", "weight": 0.5}}
    mix = Mixture(sources, shuffle=False, fields=["jpg", "cls"], samples=data.samples)
    return make_loader(mix, batch_size=batch_size, num_workers=workers, pin_memory=pin)


VARIANTS = {
    "raw-folder": Variant("raw-folder", _raw_folder, _hwc_split,
                          "map-style Dataset over the raw folder: PIL open + resize + center crop per sample",
                          DataProfile("files")),
    "webdataset-tar": Variant("webdataset-tar", _webdataset, _hwc_split,
                              "webdataset.WebDataset over the JPEG tars, PIL decode in .map, .batched",
                              DataProfile("encoded")),
    "shardkit-tar": Variant("shardkit-tar", _shardkit(lambda d: d.jpeg_root, "tar", "jpg"), _split("jpg"),
                            "shardkit StreamingDataset + make_loader over the same JPEG tars", DataProfile("encoded")),
    "shardkit-parquet": Variant("shardkit-parquet", _shardkit(lambda d: d.jpeg_root, "parquet", "jpg"),
                                _split("jpg"), "shardkit over JPEG Parquet shards", DataProfile("encoded")),
    "shardkit-raw": Variant("shardkit-raw", _shardkit(lambda d: d.raw_root, "tar", "raw"), _split("raw"),
                            "shardkit over raw uint8 tar shards (no decode)", DataProfile("raw")),
}
# Variants that draw their own sample set (a mixture's epoch): run only when named in --variants;
# the checks compare their sample count and their observed proportions with the targets instead.
MIXTURE_VARIANTS = {
    "shardkit-mix": Variant("shardkit-mix", _mixture, _split("jpg"),
                            "shardkit Mixture of the JPEG tar and Parquet shards, 0.5 each", DataProfile("encoded")),
}
ALL_VARIANTS = {**VARIANTS, **MIXTURE_VARIANTS}
