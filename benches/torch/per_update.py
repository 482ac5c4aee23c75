"""`run.py --per-update`: the wall time and CPU time of one update of real training.

Every worker trains the model on its minibatches (forward and backward included, no
straggler, no evaluation); the clock runs over `--timed` updates after `--warmup`, on worker
(rank) 0. Also recorded, per update: the CPU time of each worker process (the median over
workers), the CPU time of one forward and backward alone (measured on each worker before
the run, the median of 10, so `worker_cpu_ms - fwdbwd_ms` is what a worker spends outside
its computation), and for syncopate the server process's CPU time over the whole run divided
by its updates. DDP: `ddp`, `ddp-scaled` (gloo, default buckets), `ddp-bf16` (with
`bf16_compress_hook`); syncopate: `bsp` (workers on the server's host exchange gradients
and models through its shared memory), `bsp-tcp` (every byte over TCP, as from another
host), `bsp-bf16` with the wire in bfloat16 (over TCP).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

import common
import syncopate
import syncopate.torch as st


def process_cpu_s() -> float:
    return time.process_time()


def fwdbwd_cpu_s(model: torch.nn.Module, seed: int) -> float:
    """The thread CPU seconds of one forward and backward of a minibatch (median of 10)."""
    stream = common.batches(0, seed + 4242)
    times = []
    for _ in range(10):
        xb, yb = next(stream)
        t = time.thread_time()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        times.append(time.thread_time() - t)
    model.zero_grad(set_to_none=True)
    return float(np.median(times))


def ddp_worker(rank: int, system: str, args: argparse.Namespace, port: int, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    model = common.make_model(args.model)
    fwdbwd = fwdbwd_cpu_s(model, args.seed)
    ddp, opt, averager = common.ddp_model(system, model, args.workers, args.lr, args.momentum)
    stream = common.batches(rank, args.seed)
    dist.barrier()
    began = cpu = 0.0
    for step in range(args.warmup + args.timed):
        if step == args.warmup:
            began, cpu = time.perf_counter(), process_cpu_s()
        xb, yb = next(stream)
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
        opt.step()
        if averager is not None:
            averager.average_parameters(ddp.parameters())
    wall, cpu = time.perf_counter() - began, process_cpu_s() - cpu
    out.put({"rank": rank, "wall_s": wall, "cpu_s": cpu, "fwdbwd_s": fwdbwd})
    dist.destroy_process_group()


def syncopate_worker(rank: int, args: argparse.Namespace, out: Any, ready: Any, address: Any) -> None:
    torch.set_num_threads(1)
    model = common.make_model(args.model)
    fwdbwd = fwdbwd_cpu_s(model, args.seed)
    flat = st.FlatModel(model)
    stream = common.batches(rank, args.seed)
    ready.put(rank)
    address = address.get()
    # Call k of `compute` starts once model version k - 1 is installed: calls warmup + 1 and
    # warmup + timed + 1 bound `timed` updates, as DDP's steps do on rank 0.
    first, last = args.warmup + 1, args.warmup + args.timed + 1
    calls = 0
    marks: dict[int, tuple[float, float]] = {}

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        nonlocal calls
        calls += 1
        if calls in (first, last):
            marks[calls] = (time.perf_counter(), process_cpu_s())
        xb, yb = next(stream)
        flat.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        flat.gather_grads()
        return float(loss.detach())

    try:
        syncopate.run_worker(address, compute, id=rank, params=flat.params.numpy(), grad=flat.grads.numpy(),
                             log=lambda _: None, give_up_after_s=5.0)
    except syncopate.WorkerError as e:
        print(f"(after the run) {e}", flush=True)
    if first in marks and last in marks:
        (t0, c0), (t1, c1) = marks[first], marks[last]
        out.put({"rank": rank, "wall_s": t1 - t0, "cpu_s": c1 - c0, "fwdbwd_s": fwdbwd})
    else:
        out.put({"rank": rank, "error": f"worker {rank} made {calls} steps, fewer than {last}"})


def summary(ranks: list[dict[str, Any]], timed: int) -> dict[str, Any]:
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        raise RuntimeError("; ".join(errors))
    rank0 = next(r for r in ranks if r["rank"] == 0)
    worker_cpu = statistics.median(r["cpu_s"] for r in ranks) / timed
    fwdbwd = statistics.median(r["fwdbwd_s"] for r in ranks)
    return {"per_update_ms": 1e3 * rank0["wall_s"] / timed, "worker_cpu_ms": 1e3 * worker_cpu,
            "fwdbwd_ms": 1e3 * fwdbwd, "outside_fwdbwd_ms": 1e3 * (worker_cpu - fwdbwd),
            "all_workers_cpu_ms": 1e3 * sum(r["cpu_s"] for r in ranks) / timed}


def memcpy_ms(floats: int) -> float:
    """Milliseconds to copy `floats` f32 values from one buffer to another (median of 5): the
    floor for a server that must receive n gradients and send n models."""
    src, dst = np.ones(floats, dtype=np.float32), np.empty(floats, dtype=np.float32)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def run(system: str, args: argparse.Namespace, ctx: Any, port: int,
        start_workers: Callable[..., Any]) -> dict[str, Any]:
    """One run of `system`; `ctx` makes the worker processes, DDP's ranks meet at `port`."""
    dim = sum(p.numel() for p in common.make_model(args.model).parameters())
    if system in ("ddp", "ddp-scaled", "ddp-bf16"):
        out = ctx.Queue()
        procs = [ctx.Process(target=ddp_worker, args=(r, system, args, port, out)) for r in range(args.workers)]
        for p in procs:
            p.start()
        ranks = [out.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join()
        return {"dim": dim, **summary(ranks, args.timed)}
    name, wire = common.wire_of(system)
    if name != "bsp":
        raise ValueError(f"--per-update compares ddp, ddp-scaled, ddp-bf16, bsp, bsp-tcp and bsp-bf16, not {system}")
    out = ctx.Queue()
    procs, start = start_workers(syncopate_worker, args, args, out)
    params = st.parameters_vector(common.make_model(args.model))
    cpu = process_cpu_s()
    report = syncopate.serve(params, syncopate.Protocol("bsp", workers=args.workers, lr=args.lr),
                             momentum=args.momentum, updates=args.warmup + args.timed + 1, on_listen=start,
                             log=lambda _: None, wire=wire,
                             shared_memory=common.shared_memory_of(system))
    cpu = process_cpu_s() - cpu
    ranks = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return {"dim": dim, "server_cpu_ms": 1e3 * cpu / report["updates"],
            "memcpy_ms": memcpy_ms(2 * args.workers * dim), **summary(ranks, args.timed)}
