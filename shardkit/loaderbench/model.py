"""The training step a bench run waits on: a simulated one (sleep) or a small ResNet-like CNN."""

from __future__ import annotations

import time

from shardkit.errors import ConfigError


def simulated_step(step_ms: float):
    """A step that sleeps: an accelerator step leaves the host CPU free for the loader workers,
    which a busy-wait on a small machine would not."""
    seconds = step_ms / 1e3

    def step(images, labels) -> None:
        if seconds:
            time.sleep(seconds)

    return step


def small_resnet(num_classes: int, width: int = 32):
    """A ResNet-like CNN (stem, three stages of two residual blocks, pooled linear head): ~1.2M parameters."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Identity() if stride == 1 and cin == cout else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.body(x) + self.skip(x))

    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = width
    for i, cout in enumerate((width, 2 * width, 4 * width)):
        layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


class ModelStep:
    """One SGD step of small_resnet on a uint8 batch, in autocast (bf16 on CPU and Ampere+ GPUs).

    No synchronisation per step: kernels queue on the GPU as in a real loop, and the meter's
    CUDA events (device='cuda') measure the GPU's idle gaps between steps.
    """

    def __init__(self, num_classes: int, device: str = "cuda", width: int = 32):
        import torch

        from shardkit.train.amp import choose_precision, make_scaler

        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("--gpu needs a CUDA device and none is visible; drop --gpu to use the "
                              "simulated step (--step-ms)")
        self.device = torch.device(device)
        self.precision = choose_precision(self.device)
        self.scaler = make_scaler(self.precision)
        self.model = small_resnet(max(num_classes, 1), width).to(self.device, memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.num_classes = max(num_classes, 1)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed input shape: pick the fastest kernels once

    def __call__(self, images, labels):
        """Forward, backward and optimizer step; returns the loss tensor (not synced)."""
        import torch
        import torch.nn.functional as F

        from shardkit.train.amp import autocast

        # non_blocking: the copy from pinned memory overlaps the previous step's kernels.
        x = images.to(self.device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = labels.to(self.device, non_blocking=True).clamp(0, self.num_classes - 1)
        x = x.float().div_(255.0)
        with autocast(self.precision):
            loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return loss.detach()

    def warm(self, batch_size: int, size: int) -> None:
        """A few steps on zeros before measuring: CUDA context, cuDNN autotuning, allocator growth."""
        import torch

        x = torch.zeros(batch_size, 3, size, size, dtype=torch.uint8)
        y = torch.zeros(batch_size, dtype=torch.int64)
        for _ in range(3):
            self(x, y)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
