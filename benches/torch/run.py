"""PyTorch DDP (gloo) against syncopate's protocols over TCP, on one machine.

Every system trains the same model from the same initial weights on MNIST 5k with
minibatches of 32 per worker, the same learning rate and momentum, `--workers` worker
processes of one thread each, until `--gradients` minibatch gradients have been computed in
all (DDP: gradients / workers steps per worker). The test accuracy is measured every
`--eval-every` x workers gradients, outside the clock (DDP: all ranks wait at a barrier
while rank 0 evaluates; syncopate: the server's `evaluate`, whose time `serve` subtracts).
Each run appends one JSON line to `--out`; `table.py` prints the medians.

    python benches/torch/run.py --model cnn --workers 4 --case one4x --systems ddp,bsp,dbw --runs 3

`--link` measures the cost of one update's communication instead: no computation (a zero
gradient), DDP's allreduce of the whole model against a syncopate BSP round trip.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import per_update  # noqa: E402

import syncopate  # noqa: E402
import syncopate.torch as st  # noqa: E402

SYSTEMS = ("ddp", "ddp-scaled", "ddp-bf16", "localsgd", "bsp", "bsp-tcp", "bsp-bf16", "backup", "dbw", "ssp", "asp")
# DDP's variants (`common.ddp_model`): `ddp-scaled` scales the learning rate to the global
# batch; `ddp-bf16` allreduces in bfloat16 (`bf16_compress_hook`); `localsgd` is PyTorch's
# post-local SGD, the straggler-tolerant baseline it ships. `bsp-bf16` is `bsp` with the wire
# in bfloat16 (`serve(wire="bf16")`): compressed is compared with compressed. `bsp-tcp` is
# `bsp` with every byte on TCP sockets (`serve(shared_memory=False)`), as across hosts.
DDP_SYSTEMS = ("ddp", "ddp-scaled", "ddp-bf16", "localsgd")


def context() -> Any:
    """Worker processes come from a fork server that has imported torch once: a fresh
    interpreter per worker would import it again for every run (seconds per process on a
    loaded machine), and forking the harness itself would copy its threads' state.
    `torch._dynamo` is what DistributedDataParallel's constructor imports on first use."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "numpy", "syncopate",
                                "syncopate.torch", "common", "per_update"])
    return ctx


def process_cpu_s() -> float:
    """CPU seconds (user and system) this process has used, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def protocol(name: str, args: argparse.Namespace) -> syncopate.Protocol:
    name, _ = common.wire_of(name)
    knobs: dict[str, Any] = {}
    if name == "backup":
        knobs["backup_workers"] = 1
    if name == "ssp":
        knobs["staleness"] = 3
    return syncopate.Protocol(name, workers=args.workers, lr=args.lr, **knobs)


def gradients_per_update(name: str, n: int) -> float:
    """About how many gradients one model update takes (to evaluate about equally often)."""
    return {"bsp": n, "backup": n - 1, "dbw": max(n - 1, 1)}.get(common.wire_of(name)[0], 1)


def time_to_target(evaluations: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, acc in evaluations if acc >= target), None)


# ---- DDP ----


def ddp_worker(rank: int, system: str, args: argparse.Namespace, port: int, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    model = common.make_model(args.model)
    straggler = common.Straggler(args.case, rank, args.seed, model, args.straggle)
    ddp, opt, averager = common.ddp_model(system, model, args.workers, args.lr, args.momentum)
    steps = args.gradients // args.workers
    every = args.eval_every
    stream = common.batches(rank, args.seed)
    x_test, y_test = common.mnist("test")
    evaluations: list[tuple[float, float]] = []
    dist.barrier()
    trained, resumed = 0.0, time.perf_counter()
    for step in range(1, steps + 1):
        straggler.delay()
        xb, yb = next(stream)
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
        opt.step()
        if averager is not None:
            averager.average_parameters(ddp.parameters())
        if step % every == 0 or step == steps:
            dist.barrier()
            trained += time.perf_counter() - resumed
            if rank == 0:
                evaluations.append((trained, common.accuracy(model, x_test, y_test)))
                model.train()
            dist.barrier()
            resumed = time.perf_counter()
    if rank == 0:
        out.put({"evaluations": evaluations, "wall_s": trained, "updates": steps})
    dist.destroy_process_group()


def run_ddp(system: str, args: argparse.Namespace, target: Any = None) -> dict[str, Any]:
    ctx = context()
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target or ddp_worker, args=(r, system, args, port, out)) for r in range(args.workers)]
    for p in procs:
        p.start()
    result = out.get(timeout=3600)
    for p in procs:
        p.join()
    return result


# ---- syncopate ----


def syncopate_worker(rank: int, args: argparse.Namespace, ready: Any, address: Any) -> None:
    torch.set_num_threads(1)
    model = common.make_model(args.model)
    straggler = common.Straggler(args.case, rank, args.seed, model, args.straggle)
    flat = st.FlatModel(model)
    stream = common.batches(rank, args.seed)
    ready.put(rank)
    address = address.get()

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        straggler.delay()
        xb, yb = next(stream)
        flat.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        flat.gather_grads()
        return float(loss.detach())

    finish(lambda: syncopate.run_worker(address, compute, id=rank, params=flat.params.numpy(),
                                        grad=flat.grads.numpy(), log=lambda _: None, give_up_after_s=5.0))


def finish(run: Any) -> None:
    """Runs a worker to its end. A worker still computing when the server stops (a straggler
    the protocol did not wait for) can find the server gone instead of reading its Stop; it
    gives up after 5 s, after the measured run, and says so on one line."""
    try:
        run()
    except syncopate.WorkerError as e:
        print(f"(after the run) {e}", file=sys.stderr)


def start_workers(target: Any, args: argparse.Namespace, *extra: Any) -> tuple[list[Any], Any]:
    """Starts the worker processes and waits until each has set up (imports, model, data,
    straggler calibration), so every worker connects within moments of the server's start.
    Returns the processes and the `on_listen` that hands them the address."""
    ctx = context()
    ready = ctx.Queue()
    addresses = [ctx.Queue() for _ in range(args.workers)]
    procs = [ctx.Process(target=target, args=(r, *extra, ready, addresses[r])) for r in range(args.workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=600)

    def on_listen(address: str) -> None:
        for q in addresses:
            q.put(address)

    return procs, on_listen


def run_syncopate(name: str, args: argparse.Namespace) -> dict[str, Any]:
    model = common.make_model(args.model)
    x_test, y_test = common.mnist("test")
    procs, start = start_workers(syncopate_worker, args, args)

    def evaluate(params: np.ndarray) -> float:
        st.load_vector(model, params)
        return common.accuracy(model, x_test, y_test)

    every = max(1, round(args.eval_every * args.workers / gradients_per_update(name, args.workers)))
    params = st.parameters_vector(model)  # the live model: `serve` trains it in place
    report = syncopate.serve(params, protocol(name, args), momentum=args.momentum, evaluate=evaluate,
                             every=every, gradients=args.gradients, on_listen=start, log=lambda _: None,
                             wire=common.wire_of(name)[1], shared_memory=common.shared_memory_of(name))
    for p in procs:
        p.join()
    evaluations = [(t, acc) for _, t, acc in report["evaluations"]]
    evaluations.append((report["wall_s"], evaluate(params)))
    return {"evaluations": evaluations, "wall_s": report["wall_s"], "updates": report["updates"]}


# ---- the link alone ----


def ddp_link_worker(rank: int, system: str, args: argparse.Namespace, port: int, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    dim = sum(p.numel() for p in common.make_model(args.model).parameters())
    flat = torch.zeros(dim)
    for _ in range(5):
        dist.all_reduce(flat)
    dist.barrier()
    t, cpu = time.perf_counter(), process_cpu_s()
    for _ in range(args.link_updates):
        dist.all_reduce(flat)
    elapsed, cpu = time.perf_counter() - t, process_cpu_s() - cpu
    if rank == 0:
        out.put({"per_update_ms": 1e3 * elapsed / args.link_updates, "dim": dim,
                 "rank_cpu_ms": 1e3 * cpu / args.link_updates})
    dist.destroy_process_group()


def link_worker(rank: int, cpu_out: Any, ready: Any, address: Any) -> None:
    torch.set_num_threads(1)
    ready.put(rank)
    address = address.get()
    updates = 0

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        nonlocal updates
        updates += 1
        return 0.0  # `grad` stays zero

    cpu = process_cpu_s()
    finish(lambda: syncopate.run_worker(address, compute, id=rank, log=lambda _: None, give_up_after_s=5.0))
    cpu_out.put((process_cpu_s() - cpu) / max(updates, 1))


def run_link(system: str, args: argparse.Namespace) -> dict[str, Any]:
    ctx = context()
    if system in DDP_SYSTEMS:
        return run_ddp(system, args, ddp_link_worker)
    params = st.parameters_vector(common.make_model(args.model))
    cpu_out = ctx.Queue()
    procs, start = start_workers(link_worker, args, cpu_out)

    # `serve` drives the protocol on this thread; the connections' readers and writers are
    # threads of this process.
    thread_cpu, cpu = time.thread_time(), process_cpu_s()
    report = syncopate.serve(params, protocol(system, args), updates=args.link_updates, on_listen=start,
                             log=lambda _: None, wire=common.wire_of(system)[1],
                             shared_memory=common.shared_memory_of(system))
    thread_cpu, cpu = time.thread_time() - thread_cpu, process_cpu_s() - cpu
    worker_cpu = [cpu_out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join()
    updates = report["updates"]
    return {"per_update_ms": 1e3 * report["wall_s"] / updates, "dim": len(params),
            "server_cpu_ms": 1e3 * cpu / updates, "protocol_thread_cpu_ms": 1e3 * thread_cpu / updates,
            "worker_cpu_ms": 1e3 * statistics.median(worker_cpu)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn", choices=list(common.MODELS))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--case", default="none", choices=["none", "one4x", "shiftexp"])
    p.add_argument("--straggle", default="burn", choices=["burn", "sleep"],
                   help="how a straggler takes its extra time: spinning on the CPU, or sleeping")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gradients", type=int, default=4000, help="minibatch gradients in all, per run")
    p.add_argument("--eval-every", type=int, default=25, help="evaluate every this many x workers gradients")
    p.add_argument("--target", type=float, default=0.93, help="the test accuracy timed")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--link", action="store_true", help="time one update's communication, no computation")
    p.add_argument("--link-updates", type=int, default=100)
    p.add_argument("--per-update", action="store_true",
                   help="time updates of real training (forward and backward included), no straggler")
    p.add_argument("--warmup", type=int, default=5, help="--per-update: updates before the clock starts")
    p.add_argument("--timed", type=int, default=60, help="--per-update: updates timed")
    p.add_argument("--out", default="torch-results.jsonl")
    p.add_argument("--allow-debug", action="store_true", help="run with a debug build of syncopate (smoke tests)")
    args = p.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}: one of {', '.join(SYSTEMS)}")
    build = getattr(syncopate._native, "BUILD", "unknown")
    if build != "release" and not args.allow_debug:
        p.error(f"the syncopate module is a {build} build ({syncopate.__file__}): its timings mean nothing; "
                "build it with `maturin build --release` (or pass --allow-debug for a smoke test)")
    with open(args.out, "a") as out:
        # The systems take turns within each repetition, so a change in the machine's load
        # (other processes) falls on every system alike; the load average is recorded.
        for run in range(args.runs):
            for system in systems:
                row: dict[str, Any] = {"system": system, "model": args.model, "straggle": args.straggle, "workers": args.workers, "run": run,
                                       "lr": args.lr, "momentum": args.momentum, "cores": os.cpu_count(),
                                       "build": build, "load_before": os.getloadavg()[0]}
                began = time.perf_counter()
                if args.per_update:
                    row.update(kind="per_update", **(per_update.run(system, args, context(), free_port(), start_workers)))
                    print(f"{system:7} {row['per_update_ms']:.2f} ms/update (dim {row['dim']}, load "
                          f"{row['load_before']:.1f})", flush=True)
                elif args.link:
                    row.update(kind="link", **run_link(system, args))
                    print(f"{system:7} link {row['per_update_ms']:.2f} ms/update (dim {row['dim']})", flush=True)
                else:
                    result = run_ddp(system, args) if system in DDP_SYSTEMS else run_syncopate(system, args)
                    row.update(kind="train", case=args.case, gradients=args.gradients, target=args.target,
                               time_to_target_s=time_to_target(result["evaluations"], args.target),
                               final_accuracy=result["evaluations"][-1][1], wall_s=result["wall_s"],
                               updates=result["updates"], evaluations=result["evaluations"])
                    ttt = row["time_to_target_s"]
                    print(f"{system:7} {args.case:8} run {run}: to {args.target}: "
                          f"{'-' if ttt is None else f'{ttt:.2f} s'}, final {row['final_accuracy']:.3f}, "
                          f"{row['wall_s']:.2f} s (load {row['load_before']:.1f})", flush=True)
                row["load_after"] = os.getloadavg()[0]
                row["run_s"] = time.perf_counter() - began  # with start-up and evaluations
                out.write(json.dumps(row) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
