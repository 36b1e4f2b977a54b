"""Recipe: raw image folder -> cached shardkit build -> small CNN trained with AMP, accumulation,
the StarvationMeter, spot-safe checkpoints and early stopping on a held-out split.

    python pipelines/image_classification.py RAW DATA RUN --image-size 32 --max-steps 200

Kill it at any moment and run the same command again: it resumes from the last checkpoint with
the data exactly where it stopped. On SIGTERM (a preempted machine) or SIGUSR1 (SLURM's warning,
`sbatch --signal=USR1@120`; see --stop-signals) it finishes the step, checkpoints and exits 128 +
signal; the same command continues from that step. The plumbing every recipe shares (split and build once,
session, checkpointed loop, command line) is shardkit.recipes: copy this file alone.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from shardkit.recipes import Recipe, fit, open_session, parse, prepare, setup_logging


@dataclass(frozen=True)
class ImageRecipe(Recipe):
    image_size: int = 32

    def __post_init__(self):
        super().__post_init__()
        if self.image_size < 8:
            raise SystemExit(f"--image-size {self.image_size}: expected at least 8 pixels")


def image_config(recipe: ImageRecipe):
    from shardkit.config import BuildConfig

    def make(src: str, out: str):
        # raw uint8 at a fixed size: the loader does no decoding at all (the fastest path).
        return BuildConfig(src=src, out=out, image_size=recipe.image_size, resize_mode="center-crop",
                           encode="raw", workers=recipe.build_workers, progress=False)

    return make


# -- training --------------------------------------------------------------------------------
class ImagesOnly:
    """batch_transform (runs in the loader workers): keep the samples with an image and a label.

    A mixed raw folder also holds text documents; they are in the dataset but not in this task.
    """

    def __init__(self, field: str = "raw"):
        self.field = field

    def __call__(self, batch: dict) -> dict:
        import torch

        images, labels = batch[self.field], batch["cls"]
        # Samples lacking a field read as None in a list column (or -1 in an int tensor).
        values = labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)
        keep = [i for i, label in enumerate(values) if label is not None and label >= 0 and images[i] is not None]
        if isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor) and len(keep) == len(values):
            return {"__key__": batch["__key__"], self.field: images, "cls": labels}
        stacked = torch.stack([images[i] for i in keep]) if keep else torch.zeros((0,), dtype=torch.uint8)
        return {"__key__": [batch["__key__"][i] for i in keep], self.field: stacked,
                "cls": torch.tensor([values[i] for i in keep], dtype=torch.int64)}


def small_cnn(classes: int):
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, classes),
    )


def main(argv=None) -> dict:
    recipe = parse(argv, ImageRecipe)  # before the heavy imports: a bad flag fails fast
    import torch

    from shardkit.manifest import load_manifest
    from shardkit.train import classification_loss

    setup_logging(recipe)  # Dask's lines only with --debug
    os.makedirs(recipe.run, exist_ok=True)
    train_dir, val_dir = prepare(recipe.src, recipe.data, recipe.val_pct, image_config(recipe))
    torch.manual_seed(recipe.seed)  # the same initial weights on every start; a resume overwrites them
    model = small_cnn(len(load_manifest(train_dir).classes or []))
    return fit(open_session(recipe, model, classification_loss, train_dir, val_dir, ImagesOnly("raw")))


if __name__ == "__main__":
    main(sys.argv[1:])
