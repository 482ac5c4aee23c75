"""What both sides of the comparison share: the models, the data, the minibatch streams,
the emulated stragglers and the test accuracy."""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np
import torch

import syncopate

BATCH = 32


def wire_of(system: str) -> tuple[str, str]:
    """A syncopate system's protocol and wire encoding: `bsp-bf16` is `bsp` with gradients and
    models in bfloat16 on the wire (the server keeps float32); `bsp-tcp` is `bsp` in f32."""
    name, _, wire = system.partition("-")
    if wire == "tcp":
        return name, "f32"
    return (name, wire) if wire in ("bf16", "fp16") else (system, "f32")


def shared_memory_of(system: str) -> bool:
    """Whether a syncopate system's workers may use the server's shared memory (on one host):
    `bsp-tcp` keeps every gradient and model on the TCP sockets, as a worker on another host
    would; a compressed wire always does."""
    return not system.endswith("-tcp")


WIDE_MLPS = {"mlp4m": 1650, "mlp16m": 3600, "mlp64m": 7600}
MODELS = ("cnn", "mlp", *WIDE_MLPS)


def make_model(name: str) -> torch.nn.Module:
    """`cnn`: two conv layers and a linear layer, 5,994 parameters. `mlp`: 784-1024-256-10,
    1,068,810 parameters. `mlp4m`, `mlp16m`, `mlp64m`: 784-W-W-10 with W = 1,650, 3,600
    and 7,600 (4.0 M, 15.8 M and 63.8 M parameters). The same initial weights in every
    process."""
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
    if name in WIDE_MLPS:
        w = WIDE_MLPS[name]
        return nn.Sequential(nn.Flatten(), nn.Linear(784, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
    raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")


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


class Straggler:
    """Emulated slowness, added before each step's computation.

    `none`: nothing. `one4x`: worker 0 takes four times its measured step time. `shiftexp`:
    every worker's step takes its measured time times (1 + X), X exponential with mean 1 (a
    shifted exponential). The step time is measured once, before the run, on this worker
    (forward and backward of `BATCH` images, the median of 10).

    `how`: `burn` (the default) spins on the CPU for the added time, as a slower worker
    does, so the core is not handed to the other processes; `sleep` sleeps, which frees the
    core for the ranks of a protocol that does not wait (rows made this way are labelled).
    """

    def __init__(self, case: str, rank: int, seed: int, model: torch.nn.Module, how: str = "burn") -> None:
        if case not in ("none", "one4x", "shiftexp"):
            raise ValueError(f"unknown case {case!r}: none, one4x or shiftexp")
        if how not in ("burn", "sleep"):
            raise ValueError(f"unknown straggler kind {how!r}: burn or sleep")
        self.case, self.rank, self.how = case, rank, how
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

    def wait(self, seconds: float) -> None:
        if self.how == "sleep":
            time.sleep(seconds)
            return
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def delay(self) -> None:
        if self.case == "one4x" and self.rank == 0:
            self.wait(3.0 * self.step_s)
        elif self.case == "shiftexp":
            self.wait(self.step_s * float(self.rng.exponential(1.0)))


# Post-local SGD: synchronous steps before every rank steps alone, and the steps between two
# averagings of the models.
LOCALSGD_START, LOCALSGD_PERIOD = 20, 4


def ddp_model(system: str, model: torch.nn.Module, workers: int, lr: float, momentum: float) -> tuple:
    """The DDP-wrapped model, its optimizer and (post-local SGD) the model averager.

    `ddp`: SGD at `lr`. `ddp-bf16`: the same with PyTorch's `bf16_compress_hook` (each
    bucket allreduced in bfloat16, the compressed counterpart of syncopate's `bsp-bf16`).
    `ddp-scaled`: at `lr` times the number of workers (the linear scaling
    rule for DDP's `workers`-times-larger global batch). `localsgd`: PyTorch's post-local SGD
    (`post_localSGD_hook`, `PeriodicModelAverager`): `LOCALSGD_START` synchronous steps, then
    every rank steps on its own gradient and the models are averaged every `LOCALSGD_PERIOD`
    steps."""
    import torch.distributed as dist

    ddp = torch.nn.parallel.DistributedDataParallel(model)
    scaled = lr * workers if system == "ddp-scaled" else lr
    opt = torch.optim.SGD(ddp.parameters(), lr=scaled, momentum=momentum)
    averager = None
    if system == "ddp-bf16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        ddp.register_comm_hook(None, bf16_compress_hook)
    if system == "localsgd":
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState, post_localSGD_hook)
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        # Subgroups of one rank: after the start, a step's allreduce is the rank's alone.
        alone, _ = dist.new_subgroups(group_size=1)
        ddp.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=alone,
                                                 start_localSGD_iter=LOCALSGD_START), post_localSGD_hook)
        averager = PeriodicModelAverager(period=LOCALSGD_PERIOD, warmup_steps=LOCALSGD_START)
    return ddp, opt, averager
