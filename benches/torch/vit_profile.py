"""Where one training step of the ViT bench (`vit.py`) spends its time: per phase, CPU time of
the thread that runs it (`time.thread_time`) and wall time (`time.perf_counter`), and every
thread's CPU time (from `/proc/self/task`), per step, on every rank.

Three forms of the same BSP training (AdamW, warm-up then cosine, `--batch` images per rank,
one torch thread per rank, no evaluation, no straggler):

- `ddp`: DistributedDataParallel (gloo).
- `loop`: the unchanged loop (`syncopate.torch.init`, `DistributedOptimizer`, rule `mean`,
  rank 0 hosting the server).
- `serve`: `syncopate.serve` in the harness process with the server's AdamW, the workers a
  `run_worker` loop like `train_worker`'s.

CPU times are what a phase costs whatever else the machine runs; wall times are not
comparable between runs on a shared machine, only between phases of one run.

    python benches/torch/vit_profile.py --apis ddp,loop,serve --rounds 40 --skip 5

The `loop` form's phases inside `step()` (`gather`, `wait`, `apply`) and on the worker's
thread (`native`: the time the thread spends in the extension between two Python callbacks,
and the callbacks `compute` and `on_round`) come from wrapping the library's methods.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402
import vit  # noqa: E402

import syncopate  # noqa: E402
import syncopate.torch as st  # noqa: E402
from syncopate.torch import _layout, _optimizer, _session  # noqa: E402


class Phases:
    """Totals of CPU (the calling thread's) and wall seconds per named phase."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        self.lock = threading.Lock()

    def add(self, name: str, cpu: float, wall: float) -> None:
        with self.lock:
            t = self.totals[name]
            t[0] += cpu
            t[1] += wall
            t[2] += 1

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        c, w = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.thread_time() - c, time.perf_counter() - w)

    def reset(self) -> None:
        with self.lock:
            self.totals.clear()


#: The key of the whole process's CPU time (every thread, those that ended included).
PROCESS = "(process: all threads)"


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Every thread of this process: its name and CPU seconds (user and system) so far; and
    the whole process's under the id -1."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    found = {-1: (PROCESS, run.process_cpu_s())}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        n = int(tid)
        found[n] = (names.get(n, comm), (int(fields[11]) + int(fields[12])) / tick)
    return found


def thread_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for tid, (name, cpu) in after.items():
        key = "main" if tid == os.getpid() else PROCESS if tid == -1 else name
        out[key] += cpu - before.get(tid, (name, 0.0))[1]
    return dict(out)


def wrap(cls: Any, method: str, name: str, phases: Phases) -> None:
    original = getattr(cls, method)

    def timed(*a: Any, **k: Any) -> Any:
        with phases(name):
            return original(*a, **k)

    setattr(cls, method, timed)


def wrap_callback(cls: Any, method: str, name: str, phases: Phases, last: dict[int, tuple[float, float]]) -> None:
    """Times a callback the extension calls on the worker's thread, and the time that thread
    spent in the extension since its previous callback returned (`native`)."""
    original = getattr(cls, method)

    def timed(*a: Any, **k: Any) -> Any:
        c, w = time.thread_time(), time.perf_counter()
        me = threading.get_ident()
        if me in last:
            phases.add("worker thread: native", c - last[me][0], w - last[me][1])
        try:
            return original(*a, **k)
        finally:
            c2, w2 = time.thread_time(), time.perf_counter()
            phases.add(f"worker thread: {name}", c2 - c, w2 - w)
            last[me] = (c2, w2)

    setattr(cls, method, timed)


def hand_offs(phases: Phases) -> None:
    """Wall time of the two hand-overs between the threads: from the worker's thread entering
    `compute` (a vector arrived) to the training thread's `wait` returning, and from
    `submit` to `compute` returning on the worker's thread."""
    marks: dict[str, float] = {}
    compute, wait, submit = _session.Bridge._compute, _session.Bridge.wait, _session.Bridge.submit

    def timed_compute(self: Any, *a: Any) -> Any:
        marks["arrived"] = time.perf_counter()
        try:
            return compute(self, *a)
        finally:
            if "submitted" in marks:
                phases.add("hand-off: gradient to the worker's thread", 0.0, time.perf_counter() - marks["submitted"])

    def timed_wait(self: Any, *a: Any) -> Any:
        try:
            return wait(self, *a)
        finally:
            if "arrived" in marks:
                phases.add("hand-off: vector to the training thread", 0.0, time.perf_counter() - marks["arrived"])

    def timed_submit(self: Any, *a: Any) -> Any:
        marks["submitted"] = time.perf_counter()
        return submit(self, *a)

    _session.Bridge._compute, _session.Bridge.wait, _session.Bridge.submit = timed_compute, timed_wait, timed_submit


def instrument(phases: Phases) -> None:
    last: dict[int, tuple[float, float]] = {}
    hand_offs(phases)
    wrap(_layout.Layout, "gather", "step: gather", phases)
    wrap(_session.Bridge, "wait", "step: wait", phases)
    wrap(_optimizer.DistributedOptimizer, "_apply_round", "step: apply", phases)
    wrap_callback(_session.Bridge, "_compute", "compute", phases, last)
    wrap_callback(_session.Bridge, "_on_round", "on_round", phases, last)


def result(rank: int, phases: Phases, before: Any, wall: float, steps: int) -> dict[str, Any]:
    return {"rank": rank, "steps": steps, "wall_s": wall, "phases": dict(phases.totals),
            "threads": thread_delta(before, thread_cpu())}


def training(args: argparse.Namespace, phases: Phases, step_fn: Any, stream: Any, model: Any, opt: Any,
             sched: Any) -> tuple[Any, float]:
    """Runs `--skip` untimed steps then `--rounds` timed ones; the CPU snapshot and wall time."""
    before, began = None, 0.0
    for i in range(args.skip + args.rounds):
        if i == args.skip:
            phases.reset()
            before, began = thread_cpu(), time.perf_counter()
        with phases("data"):
            xb, yb = next(stream)
        with phases("zero_grad"):
            opt.zero_grad()
        with phases("forward"):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
        with phases("backward"):
            loss.backward()
        with phases("step"):
            step_fn(loss)
        with phases("sched"):
            sched.step()
    return before, time.perf_counter() - began


def ddp_worker(rank: int, args: argparse.Namespace, port: int, out: Any) -> None:
    model, stream = vit.worker_setup(rank, args)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = vit.adamw(ddp.parameters(), args.lr, args)
    warmup, total = vit.schedule_steps("ddp", args)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: vit.warmup_cosine(t, warmup, total))
    phases = Phases()
    dist.barrier()
    before, wall = training(args, phases, lambda loss: opt.step(), stream, ddp, opt, sched)
    out.put(result(rank, phases, before, wall, args.rounds))
    dist.destroy_process_group()


def loop_worker(rank: int, args: argparse.Namespace, port: int, out: Any) -> None:
    model, stream = vit.worker_setup(rank, args)
    phases = Phases()
    instrument(phases)
    warmup, total = vit.schedule_steps("bsp", args)
    st.init(vit.protocol("bsp", args), rank=rank, address=f"127.0.0.1:{port}", log=lambda _: None,
            give_up_after_s=5.0, **({"server": args.server} if args.server else {}))
    opt = st.DistributedOptimizer(vit.adamw(model.parameters(), args.lr, args), model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: vit.warmup_cosine(t, warmup, total))
    before, wall = training(args, phases, lambda loss: opt.step(loss=loss), stream, model, opt, sched)
    out.put(result(rank, phases, before, wall, args.rounds))
    st.shutdown(timeout_s=30.0)


def serve_worker(rank: int, args: argparse.Namespace, ready: Any, address: Any) -> None:
    model, stream = vit.worker_setup(rank, args)
    flat = st.FlatModel(model)
    phases = Phases()
    state: dict[str, Any] = {"n": 0, "before": None, "began": 0.0, "last": None}

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        c, w = time.thread_time(), time.perf_counter()
        if state["n"] == args.skip:
            phases.reset()
            state["before"], state["began"] = thread_cpu(), w
        elif state["last"] is not None:
            phases.add("native (send, wait, receive)", c - state["last"][0], w - state["last"][1])
        state["n"] += 1
        with phases("data"):
            xb, yb = next(stream)
        with phases("zero_grad"):
            flat.zero_grad()
        with phases("forward"):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
        with phases("backward"):
            loss.backward()
            flat.gather_grads()
        if state["n"] == args.skip + args.rounds:
            ready.put(result(rank, phases, state["before"], time.perf_counter() - state["began"], args.rounds))
        state["last"] = (time.thread_time(), time.perf_counter())
        return float(loss.detach())

    ready.put(rank)
    connect = address.get()
    run.finish(lambda: syncopate.run_worker(connect, compute, id=rank, params=flat.params.numpy(),
                                            grad=flat.grads.numpy(), log=lambda _: None, give_up_after_s=5.0))


def run_serve(args: argparse.Namespace) -> list[dict[str, Any]]:
    ctx = run.context()
    ready = ctx.Queue()
    addresses = [ctx.Queue() for _ in range(args.workers)]
    procs = [ctx.Process(target=serve_worker, args=(r, args, ready, addresses[r])) for r in range(args.workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=600)
    model = vit.make_vit(args)
    params = st.parameters_vector(model)
    marks: dict[str, Any] = {}

    def on_listen(address: str) -> None:
        marks["before"] = thread_cpu()
        for q in addresses:
            q.put(address)

    report = syncopate.serve(params, vit.protocol("bsp", args), optimizer=vit.server_optimizer("bsp", args),
                             updates=args.skip + args.rounds, on_listen=on_listen, log=lambda _: None)
    rows = [ready.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    server = {"rank": "server", "steps": report["updates"], "wall_s": report["wall_s"], "phases": {},
              "threads": thread_delta(marks["before"], thread_cpu())}
    return sorted(rows, key=lambda r: r["rank"]) + [server]


def run_ranks(target: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    ctx = run.context()
    out = ctx.Queue()
    port = run.free_port()
    procs = [ctx.Process(target=target, args=(r, args, port, out)) for r in range(args.workers)]
    for p in procs:
        p.start()
    rows = [out.get(timeout=1200) for _ in procs]
    for p in procs:
        p.join()
    return sorted(rows, key=lambda r: r["rank"])


def show(api: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n### {api}\n")
    for r in rows:
        n = max(r["steps"], 1)
        print(f"rank {r['rank']}: {r['steps']} steps, {r['wall_s'] / n * 1e3:.1f} ms wall per step")
        if r["phases"]:
            print("\n| phase | CPU ms/step | wall ms/step | calls/step |\n|---|---|---|---|")
            for name, (cpu, wall, calls) in sorted(r["phases"].items()):
                print(f"| {name} | {cpu / n * 1e3:.1f} | {wall / n * 1e3:.1f} | {calls / n:.2f} |")
        print("\n| thread | CPU ms/step |\n|---|---|")
        for name, cpu in sorted(r["threads"].items(), key=lambda kv: -kv[1]):
            if cpu > 0:
                print(f"| {name} | {cpu / n * 1e3:.1f} |")
        print()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--apis", default="ddp,loop,serve")
    p.add_argument("--rounds", type=int, default=40, help="timed steps per rank")
    p.add_argument("--skip", type=int, default=5, help="untimed steps first")
    p.add_argument("--server", default=None, help="loop: init(server=...) (default: the library's)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--total", type=int, default=800)
    p.add_argument("--gradients", type=int, default=1600)
    p.add_argument("--async-lr", type=float)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--mlp-ratio", type=int, default=4)
    p.add_argument("--patch", type=int, default=7)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    args.case = "none"
    print(f"ViT: {vit.parameter_count(vit.make_vit(args)):,} parameters; {args.workers} ranks, "
          f"{args.rounds} timed steps after {args.skip}; syncopate build {getattr(syncopate._native, 'BUILD', '?')}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    for api in args.apis.split(","):
        if api == "ddp":
            rows = run_ranks(ddp_worker, args)
        elif api == "loop":
            rows = run_ranks(loop_worker, args)
        elif api == "serve":
            rows = run_serve(args)
        else:
            p.error(f"unknown api {api!r}: ddp, loop or serve")
        show(api, rows)
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
