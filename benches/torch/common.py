"""What both sides of the comparison share: the models, the data, the minibatch streams,
the emulated stragglers and the test accuracy."""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np
import torch

import syncopate

BATCH = 32


def make_model(name: str) -> torch.nn.Module:
    """`cnn`: two conv layers and a linear layer, 5,994 parameters. `mlp`: 784-1024-256-10,
    1,068,810 parameters. The same initial weights in every process."""
    torch.manual_seed(0)
    nn = torch.nn
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 8, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(256, 10),
        )
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 10)
        )
    raise ValueError(f"unknown model {name!r}: cnn or mlp")


def mnist(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST 5k as syncopate ships it (4,000 training, 1,000 test images)."""
    data = syncopate.load_mnist5k()
    return torch.from_numpy(data[f"x_{split}"]).view(-1, 1, 28, 28), torch.from_numpy(data[f"y_{split}"])


def batches(rank: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Worker `rank`'s minibatches: `BATCH` training images drawn uniformly, forever."""
    x, y = mnist("train")
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    while True:
        rows = torch.randint(0, len(x), (BATCH,), generator=g)
        yield x[rows], y[rows]


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


CASES = ("none", "one4x", "shiftexp", "burn4x")


class Straggler:
    """Emulated slowness, added before each step's computation.

    `none`: nothing. `one4x`: worker 0 sleeps three times its measured step time, so it takes
    four times as long. `shiftexp`: every worker sleeps its measured time times X, X
    exponential with mean 1 (a shifted exponential). `burn4x`: the last worker runs a busy loop
    for three times its measured step time: four times as slow, and it keeps its core busy
    (a sleeping straggler hands its core to the others). The step time is measured once,
    before the run, on this worker (forward and backward of `BATCH` images, the median of 10).
    """

    def __init__(self, case: str, rank: int, seed: int, model: torch.nn.Module, workers: int) -> None:
        if case not in CASES:
            raise ValueError(f"unknown case {case!r}: {', '.join(CASES)}")
        self.case, self.rank, self.last = case, rank, rank == workers - 1
        self.rng = np.random.default_rng(seed * 7919 + rank)
        self.step_s = self.measure(model) if case != "none" else 0.0

    @staticmethod
    def measure(model: torch.nn.Module) -> float:
        stream = batches(0, 12345)
        times = []
        for _ in range(10):
            xb, yb = next(stream)
            t = time.perf_counter()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            times.append(time.perf_counter() - t)
        model.zero_grad(set_to_none=True)
        return float(np.median(times))

    def delay(self) -> None:
        if self.case == "one4x" and self.rank == 0:
            time.sleep(3.0 * self.step_s)
        elif self.case == "burn4x" and self.last:
            until = time.perf_counter() + 3.0 * self.step_s
            while time.perf_counter() < until:
                pass
        elif self.case == "shiftexp":
            time.sleep(self.step_s * float(self.rng.exponential(1.0)))
