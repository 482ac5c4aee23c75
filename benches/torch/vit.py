"""A small vision transformer on MNIST 5k: PyTorch DDP (gloo) against syncopate over TCP.

Every system trains the same ViT (`make_vit`, the same initial weights) on MNIST 5k as
syncopate ships it, with `--batch` images per minibatch per worker drawn uniformly (each
rank its own seeded stream), AdamW (`--lr`, betas 0.9/0.999, eps 1e-8, `--weight-decay` on
every parameter) and a linear warm-up then a half cosine (`warmup_cosine`, the core's
`warmup-cosine` schedule), `--workers` processes of one thread each
(`torch.set_num_threads(1)`), until the test accuracy reaches `--target` or `--gradients`
minibatch gradients have been computed in all. The test accuracy is measured every
`--eval-every` rounds (a round: one gradient per worker), outside the clock. Each run appends
one JSON line to `--out`; `--table FILE...` prints the medians as markdown.

Systems:
- `ddp`: DistributedDataParallel (gloo), AdamW at `--lr` on the mean of the workers' gradients.
- `ddp-scaled`: the same with the learning rate scaled to DDP's global batch (workers x
  `--batch`): `--lr` x workers (`--scaled-rule linear`) or x sqrt(workers) (`sqrt`).
- `localsgd`: DDP with post-local SGD (`PostLocalSGDState`, `post_localSGD_hook`): after
  `--local-start` steps every rank steps alone, and `PeriodicModelAverager` averages the
  models every `--period` steps; AdamW on every rank.
- `bsp`, `backup` (b = 1), `ssp` (s = 3), `asp`: syncopate's protocols over TCP.

The syncopate side has two forms (`--api`):
- `serve`: the harness process runs `syncopate.serve` with the server's AdamW and schedule
  (`syncopate.Optimizer`), the workers `syncopate.torch.train_worker`; the server evaluates
  its model (its time is left out of the run's clock).
- `loop` (the default): the training loop as a DDP user writes it (`syncopate.torch.init`,
  `DistributedOptimizer`): under BSP and backup every worker applies the round's mean
  gradient with its own torch AdamW and LambdaLR; under SSP and ASP the server's AdamW and
  schedule update the model. Rank 0 hosts the server and evaluates its model every
  `--eval-every` of its steps, off its clock, while the other ranks wait before their next
  step (as DDP's ranks wait at a barrier, and as workers wait for the server's reply while
  it evaluates under `serve`).

One schedule for all: the warm-up and the total are counted in rounds (`--warmup`,
`--total`, default the whole `--gradients` budget), and a protocol whose update takes fewer
gradients than a round counts them in its own updates (`updates_per_round`). ASP and SSP
step the server's AdamW once per gradient, so they run at `--async-lr` (default `--lr` /
workers): the model moves about as far per gradient as under BSP.

Cases (`--case`): `none`; `burn4x`: before each step, the last worker runs a busy loop for
three times its measured step time (forward and backward of one minibatch, the median of
10), so it takes four times as long and keeps its core busy, as a slower machine would. The
last, not worker 0: under `--api loop` rank 0 hosts the server and evaluates.

    python benches/torch/vit.py --case burn4x --systems ddp,localsgd,bsp,backup,asp --runs 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import run  # noqa: E402

import syncopate  # noqa: E402
import syncopate.torch as st  # noqa: E402

SYSTEMS = ("ddp", "ddp-scaled", "localsgd", "bsp", "backup", "ssp", "asp")
SYNCOPATE = ("bsp", "backup", "ssp", "asp")
ROUND_PROTOCOLS = ("bsp", "backup")
LABELS = {"ddp": "DDP", "ddp-scaled": "DDP, lr scaled", "localsgd": "post-local SGD", "bsp": "BSP",
          "backup": "backup b=1", "ssp": "SSP s=3", "asp": "ASP"}


# ---- the model, the data, the schedule, the straggler ----


class ViT(torch.nn.Module):
    """Patches of `patch` x `patch` pixels embedded in `dim` features, a class token and
    learned positions, `depth` pre-norm encoder layers (`heads` heads, an MLP of
    `mlp_ratio` x `dim`, GELU), a final LayerNorm and a linear head on the class token."""

    def __init__(self, dim: int, depth: int, heads: int, mlp_ratio: int, patch: int) -> None:
        super().__init__()
        if 28 % patch:
            raise ValueError(f"--patch {patch} does not divide 28")
        tokens = (28 // patch) ** 2
        self.embed = torch.nn.Conv2d(1, dim, patch, stride=patch)
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = torch.nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(dim, heads, dim * mlp_ratio, dropout=0.0, activation="gelu",
                                                 batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


def make_vit(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    return ViT(args.dim, args.depth, args.heads, args.mlp_ratio, args.patch)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def batches(rank: int, args: argparse.Namespace, straggler: Straggler) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Worker `rank`'s minibatches: `--batch` training images drawn uniformly, forever; the
    straggler's delay runs before each one is handed out (inside the step)."""
    x, y = common.mnist("train")
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    while True:
        rows = torch.randint(0, len(x), (args.batch,), generator=g)
        straggler.delay()
        yield x[rows], y[rows]


def warmup_cosine(t: int, warmup: int, total: int, floor: float = 0.0) -> float:
    """The factor of the learning rate at update `t` (from 0): the core's `warmup-cosine`
    schedule, `floor + (1 - floor) (t + 1) / warmup` over the warm-up, then a half cosine
    from 1 to `floor` at update `total`, then `floor`."""
    rise = 1.0 - floor
    if t < warmup:
        below = 1.0 - (t + 1) / warmup
    elif t < total:
        below = 0.5 * (1.0 - math.cos(math.pi * (t - warmup) / (total - warmup)))
    else:
        return floor
    return min(1.0, max(floor, 1.0 - rise * below))


def updates_per_round(system: str, workers: int) -> float:
    """How many model updates one round of gradients (one per worker) makes."""
    per_update = {"backup": max(workers - 1, 1), "ssp": 1, "asp": 1}.get(system, workers)
    return workers / per_update


def schedule_steps(system: str, args: argparse.Namespace) -> tuple[int, int]:
    """The warm-up and total of the schedule in `system`'s own updates."""
    k = 1.0 if system in ("ddp", "ddp-scaled", "localsgd") else updates_per_round(system, args.workers)
    total = args.total if args.total is not None else args.gradients // args.workers
    return max(1, round(args.warmup * k)), max(round(total * k), round(args.warmup * k) + 1)


def system_lr(system: str, args: argparse.Namespace) -> float:
    if system == "ddp-scaled":
        return args.lr * (args.workers if args.scaled_rule == "linear" else math.sqrt(args.workers))
    if system in ("ssp", "asp"):
        return args.async_lr if args.async_lr is not None else args.lr / args.workers
    return args.lr


class Straggler:
    """`burn4x`: the last worker busy-loops for three times its measured step time before each
    step. `none`: nothing. The step time is measured once, before the run (forward and
    backward of one minibatch, the median of 10)."""

    def __init__(self, case: str, rank: int, workers: int, model: torch.nn.Module, batch: int) -> None:
        self.burn_s = 0.0
        if case == "burn4x" and rank == workers - 1:
            x, y = common.mnist("train")
            times = []
            for i in range(10):
                t = time.perf_counter()
                torch.nn.functional.cross_entropy(model(x[i * batch:(i + 1) * batch]), y[i * batch:(i + 1) * batch]).backward()
                times.append(time.perf_counter() - t)
            model.zero_grad(set_to_none=True)
            self.burn_s = 3.0 * float(np.median(times))

    def delay(self) -> None:
        if self.burn_s:
            until = time.perf_counter() + self.burn_s
            while time.perf_counter() < until:
                pass


def worker_setup(rank: int, args: argparse.Namespace) -> tuple[torch.nn.Module, Iterator[Any]]:
    torch.set_num_threads(1)
    model = make_vit(args)
    straggler = Straggler(args.case, rank, args.workers, model, args.batch)
    return model, batches(rank, args, straggler)


def adamw(params: Any, lr: float, args: argparse.Namespace) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay)


# ---- DDP and post-local SGD ----


def ddp_worker(rank: int, system: str, args: argparse.Namespace, port: int, out: Any) -> None:
    model, stream = worker_setup(rank, args)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    averager = None
    if system == "localsgd":
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState, post_localSGD_hook)
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        # Subgroups of one rank: after the warm-up each rank steps alone, and the averager
        # is the only communication.
        subgroup, _ = dist.new_subgroups(group_size=1)
        ddp.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=subgroup,
                                                 start_localSGD_iter=args.local_start), post_localSGD_hook)
        averager = PeriodicModelAverager(period=args.period, warmup_steps=args.local_start)
    opt = adamw(ddp.parameters(), system_lr(system, args), args)
    warmup, total = schedule_steps(system, args)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: warmup_cosine(t, warmup, total))
    steps = args.gradients // args.workers

    def averaged(step: int) -> bool:
        # Whether the models are equal after `step` (from 1): always under DDP; under
        # post-local SGD during its DDP warm-up and at the averager's steps (it averages at
        # its count `step - 1` when that is `local_start + k period`).
        return averager is None or step <= args.local_start or (step - 1 - args.local_start) % args.period == 0

    x_test, y_test = common.mnist("test")
    evaluations: list[tuple[float, float]] = []
    stop = torch.zeros(1)
    dist.barrier()
    trained, resumed = 0.0, time.perf_counter()
    step, next_eval = 0, args.eval_every
    for step in range(1, steps + 1):
        xb, yb = next(stream)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
        opt.step()
        sched.step()
        if averager is not None:
            averager.average_parameters(ddp.parameters())
        # Evaluated at the first step with equal models from every `--eval-every` steps on.
        if (step >= next_eval and averaged(step)) or step == steps:
            while next_eval <= step:
                next_eval += args.eval_every
            dist.barrier()
            trained += time.perf_counter() - resumed
            if rank == 0:
                evaluations.append((trained, common.accuracy(model, x_test, y_test)))
                model.train()
                stop[0] = float(evaluations[-1][1] >= args.target)
            dist.broadcast(stop, 0)
            dist.barrier()
            resumed = time.perf_counter()
            if stop[0]:
                break
    if rank == 0:
        out.put({"evaluations": evaluations, "wall_s": trained, "updates": step})
    dist.destroy_process_group()


def run_ddp(system: str, args: argparse.Namespace) -> dict[str, Any]:
    ctx = run.context()
    out = ctx.Queue()
    port = run.free_port()
    procs = [ctx.Process(target=ddp_worker, args=(r, system, args, port, out)) for r in range(args.workers)]
    for p in procs:
        p.start()
    result = out.get(timeout=3600)
    for p in procs:
        p.join()
    return result


# ---- syncopate: the server's AdamW (`--api serve`) ----


def server_optimizer(system: str, args: argparse.Namespace) -> Any:
    if not hasattr(syncopate, "Optimizer"):
        raise SystemExit("this syncopate build has no syncopate.Optimizer (the server's AdamW)")
    warmup, total = schedule_steps(system, args)
    return syncopate.Optimizer("adamw", betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay,
                               schedule=f"warmup-cosine:{warmup}:{total}")


def protocol(system: str, args: argparse.Namespace, **extra: Any) -> syncopate.Protocol:
    knobs: dict[str, Any] = {"backup": {"backup_workers": 1}, "ssp": {"staleness": 3}}.get(system, {})
    return syncopate.Protocol(system, workers=args.workers, lr=system_lr(system, args), **knobs, **extra)


def serve_worker(rank: int, args: argparse.Namespace, ready: Any, address: Any) -> None:
    model, stream = worker_setup(rank, args)
    ready.put(rank)
    connect = address.get()
    run.finish(lambda: st.train_worker(model, torch.nn.functional.cross_entropy, stream, connect=connect, id=rank,
                                       log=lambda _: None, give_up_after_s=5.0))


def run_serve(system: str, args: argparse.Namespace) -> dict[str, Any]:
    model = make_vit(args)
    x_test, y_test = common.mnist("test")
    procs, start = run.start_workers(serve_worker, args, args)

    def evaluate(params: np.ndarray) -> float:
        st.load_vector(model, params)
        return common.accuracy(model, x_test, y_test)

    every = max(1, round(args.eval_every * updates_per_round(system, args.workers)))
    params = st.parameters_vector(model)
    report = syncopate.serve(params, protocol(system, args), optimizer=server_optimizer(system, args),
                             evaluate=evaluate, every=every, target=args.target, gradients=args.gradients,
                             on_listen=start, log=lambda _: None, wire=args.wire)
    for p in procs:
        p.join()
    evaluations = [(t, acc) for _, t, acc in report["evaluations"]]
    if report["time_to_target_s"] is None:
        evaluations.append((report["wall_s"], evaluate(params)))
    return {"evaluations": evaluations, "wall_s": report["wall_s"], "updates": report["updates"]}


# ---- syncopate: the training loop as written (`--api loop`) ----


def loop_worker(rank: int, system: str, args: argparse.Namespace, port: int, out: Any, running: Any) -> None:
    """Every rank loops until the server stops (its budget of updates, or rank 0 stopping it at
    the target); rank 0 evaluates its model every `--eval-every` of its steps. While it does,
    `running` is clear and the other ranks wait before their next step, as DDP's ranks wait
    at the barrier (a protocol that does not need rank 0 would otherwise train on, off the
    clock)."""
    model, stream = worker_setup(rank, args)
    warmup, total = schedule_steps(system, args)
    server_side = system not in ROUND_PROTOCOLS
    optimizer = server_optimizer(system, args) if server_side else None
    budget = max(1, round(args.gradients / args.workers * updates_per_round(system, args.workers)))
    st.init(protocol(system, args), optimizer=optimizer, rank=rank, address=f"127.0.0.1:{port}", updates=budget,
            log=lambda _: None, give_up_after_s=5.0, wire=args.wire)
    opt = st.DistributedOptimizer(adamw(model.parameters(), system_lr(system, args), args), model,
                                  server_schedule=server_side)
    sched = None if server_side else torch.optim.lr_scheduler.LambdaLR(opt, lambda t: warmup_cosine(t, warmup, total))
    x_test, y_test = common.mnist("test")
    evaluations: list[tuple[float, float]] = []
    trained, resumed, step, reached = 0.0, time.perf_counter(), 0, False
    while not opt.should_stop:
        running.wait()
        xb, yb = next(stream)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        try:
            opt.step(loss=loss)
        except syncopate.WorkerError as e:
            if rank == 0:
                raise
            # Rank 0 stops the server at the target: a worker still computing then can find
            # the server gone instead of reading its stop (after the measured run).
            print(f"(after the run) {e}", file=sys.stderr)
            break
        if sched is not None:
            sched.step()
        step += 1
        if rank == 0 and step % args.eval_every == 0:
            running.clear()
            trained += time.perf_counter() - resumed
            evaluations.append((trained, common.accuracy(model, x_test, y_test)))
            model.train()
            resumed = time.perf_counter()
            running.set()
            if evaluations[-1][1] >= args.target:
                reached = True
                break
    if rank == 0:
        if not reached:
            trained += time.perf_counter() - resumed
            evaluations.append((trained, common.accuracy(model, x_test, y_test)))
        out.put({"evaluations": evaluations, "wall_s": trained, "updates": step})
    st.shutdown(timeout_s=0.0 if rank == 0 else 30.0)


def run_loop(system: str, args: argparse.Namespace) -> dict[str, Any]:
    ctx = run.context()
    out = ctx.Queue()
    port = run.free_port()
    running = ctx.Event()
    running.set()
    procs = [ctx.Process(target=loop_worker, args=(r, system, args, port, out, running)) for r in range(args.workers)]
    for p in procs:
        p.start()
    result = out.get(timeout=3600)
    for p in procs:
        p.join()
    return result


# ---- the table ----


def api_label(args: argparse.Namespace) -> str:
    """The syncopate side's API as the table shows it, with a compressed wire named."""
    return args.api if args.wire == "f32" else f"{args.api}, {args.wire}"


def table(paths: list[str]) -> int:
    """Medians per (case, ranks, target, model, budget) and system (with the syncopate side's
    API), and their ratios to DDP's."""
    rows = [json.loads(line) for path in paths for line in open(path) if line.strip()]
    groups: dict[tuple, dict[tuple[str, str], list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[(r["case"], r["workers"], r["target"], r["params"], r["gradients"])][(r["system"], r["api"])].append(r)
    inf = float("inf")

    def ttt(rs: list[dict[str, Any]]) -> float:
        return statistics.median(r["time_to_target_s"] if r["time_to_target_s"] is not None else inf for r in rs)

    def span(rs: list[dict[str, Any]], key: str) -> str:
        return f"{min(r[key] for r in rs):.1f}-{max(r[key] for r in rs):.1f}"

    print("Time to the test-accuracy target (training time, evaluations excluded; median of the runs, "
          "a run that missed the target counted as infinitely slow), its ratio to DDP's, and the final "
          "accuracy (median); one torch thread per rank\n")
    print("| case | ranks | cores | target | parameters | system | time to target | / DDP | final accuracy "
          "| runs | load before / after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (case, workers, target, params, _), by in sorted(groups.items()):
        ddp = ttt(by[("ddp", "ddp")]) if ("ddp", "ddp") in by else None
        order = sorted(by, key=lambda k: (SYSTEMS.index(k[0]), k[1]))
        for system, api in order:
            rs = by[(system, api)]
            t = ttt(rs)
            missed = sum(r["time_to_target_s"] is None for r in rs)
            text = ("not reached" if t == inf else f"{t:.2f} s") + (f" ({missed}/{len(rs)} missed)" if missed else "")
            ratio = f"{t / ddp:.2f}" if ddp not in (None, inf) and t != inf else ""
            label = LABELS[system] + (f" ({api})" if system in SYNCOPATE else "")
            acc = statistics.median(r["final_accuracy"] for r in rs)
            print(f"| {case} | {workers} | {rs[0]['cores']} | {target} | {params:,} | {label} | {text} | {ratio} "
                  f"| {acc:.3f} | {len(rs)} | {span(rs, 'load_before')} / {span(rs, 'load_after')} |")
    return 0


# ---- main ----


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", nargs="+", metavar="FILE", help="print the medians of these results and exit")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--case", default="none", choices=["none", "burn4x"])
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--api", default="loop", choices=["loop", "serve"], help="the syncopate side's API")
    p.add_argument("--wire", default="f32", choices=["f32", "bf16", "fp16"],
                   help="the syncopate side's encoding of gradients and models on the wire")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gradients", type=int, default=1600, help="minibatch gradients in all, at most, per run")
    p.add_argument("--eval-every", type=int, default=20, help="rounds (one gradient per worker) between evaluations")
    p.add_argument("--target", type=float, default=0.88, help="the test accuracy timed; the run stops there")
    p.add_argument("--batch", type=int, default=32, help="images per minibatch per worker")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW's peak learning rate")
    p.add_argument("--async-lr", type=float, help="the server's AdamW rate under ASP and SSP (default lr / workers)")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=20, help="rounds of linear warm-up")
    p.add_argument("--total", type=int, help="the round at which the cosine ends (default: the gradient budget's)")
    p.add_argument("--scaled-rule", default="linear", choices=["linear", "sqrt"], help="ddp-scaled: lr x n or x sqrt n")
    p.add_argument("--period", type=int, default=4, help="localsgd: steps between model averages")
    p.add_argument("--local-start", type=int, default=20, help="localsgd: steps of plain DDP first")
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--mlp-ratio", type=int, default=4)
    p.add_argument("--patch", type=int, default=7)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="vit-results.jsonl")
    p.add_argument("--allow-debug", action="store_true", help="run with a debug build of syncopate (smoke tests)")
    p.add_argument("--allow-small", action="store_true", help="allow a model under 1 M parameters (smoke tests)")
    args = p.parse_args()
    if args.table:
        return table(args.table)
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}: one of {', '.join(SYSTEMS)}")
    if args.workers < 2:
        p.error("--workers must be at least 2")
    params = parameter_count(make_vit(args))
    if params < 1_000_000 and not args.allow_small:
        p.error(f"the ViT has {params:,} parameters, under 1 M (--allow-small for a smoke test)")
    build = getattr(syncopate._native, "BUILD", "unknown")
    if build != "release" and not args.allow_debug and any(s in SYNCOPATE for s in systems):
        p.error(f"the syncopate module is a {build} build ({syncopate.__file__}): its timings mean nothing; "
                "build it with `maturin build --release` (or pass --allow-debug for a smoke test)")
    print(f"ViT: {params:,} parameters; {args.workers} ranks on {os.cpu_count()} cores, 1 thread each", flush=True)
    with open(args.out, "a") as out:
        # The systems take turns within each repetition, so a change in the machine's load
        # falls on every system alike; the load average is recorded before and after.
        for rep in range(args.runs):
            for system in systems:
                row: dict[str, Any] = {"system": system, "case": args.case, "workers": args.workers, "run": rep,
                                       "api": api_label(args) if system in SYNCOPATE else "ddp", "params": params,
                                       "lr": system_lr(system, args), "batch": args.batch, "target": args.target,
                                       "gradients": args.gradients, "cores": os.cpu_count(), "build": build,
                                       "threads_per_rank": 1, "load_before": os.getloadavg()[0]}
                began = time.perf_counter()
                if system in SYNCOPATE:
                    result = run_serve(system, args) if args.api == "serve" else run_loop(system, args)
                else:
                    result = run_ddp(system, args)
                evaluations = result["evaluations"]
                row.update(time_to_target_s=run.time_to_target(evaluations, args.target),
                           final_accuracy=evaluations[-1][1] if evaluations else 0.0, wall_s=result["wall_s"],
                           updates=result["updates"], evaluations=evaluations,
                           load_after=os.getloadavg()[0], run_s=time.perf_counter() - began)
                ttt = row["time_to_target_s"]
                print(f"{system:10} {args.case:6} run {rep}: to {args.target}: "
                      f"{'-' if ttt is None else f'{ttt:.2f} s'}, final {row['final_accuracy']:.3f}, "
                      f"{row['wall_s']:.2f} s (load {row['load_before']:.1f}-{row['load_after']:.1f})", flush=True)
                out.write(json.dumps(row) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
