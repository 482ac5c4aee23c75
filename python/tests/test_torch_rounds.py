"""The rule ``mean`` (the workers' own optimizer) across worker processes: a worker that
catches up on rounds keeps the others' learning rate, and a worker that joins after round 0
is refused with the cause named, never left hanging.

torch is required: without it these tests fail, unless $SYNCOPATE_NO_TORCH=1 says torch is
not expected here (then they are skipped).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import pytest
from ranks import finish, free_port, launch
from torch_required import require_torch

torch = require_torch()


#: One rank of a backup run (1 backup worker, 16 updates): AdamW with a LambdaLR whose rate
#: changes every step; rank 1 is five times slower, so its gradients are dropped and each of
#: its steps applies the rounds it missed. Prints the learning rate after every step that
#: applied rounds, by the last round applied, and saves the model.
CATCH_UP = """
import json, sys, time
import torch
import syncopate.torch as st

out = sys.argv[1]
st.init("backup", backup_workers=1, updates=16, log=lambda _: None, time_limit_s=60.0)
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
opt = st.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01), model)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
g = torch.Generator().manual_seed(100 + st.rank())
lrs, steps, most = {}, 0, 0
while not opt.should_stop:
    opt.zero_grad()
    x = torch.randn(16, 8, generator=g)
    torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
    time.sleep(0.05 if st.rank() == 1 else 0.01)
    before = opt.rounds
    opt.step()
    most = max(most, opt.rounds - before)
    sched.step()
    steps += 1
    if opt.rounds > before:  # (the step that finds the run stopped applies none)
        lrs[opt.rounds] = opt.param_groups[0]["lr"]
torch.save(model.state_dict(), f"{out}/rank{st.rank()}.pt")
print(json.dumps({"lrs": lrs, "steps": steps, "rounds": opt.rounds, "most": most}))
st.shutdown()
"""


def test_a_worker_catching_up_on_rounds_steps_its_scheduler_once_per_round(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "catch_up.py"
    script.write_text(CATCH_UP)
    port = free_port()
    done = finish([launch(rank, port, str(script), str(tmp_path)) for rank in range(2)])
    for code, _, err in done:
        assert code == 0, err[-3000:]
    fast, slow = (json.loads(out.strip().splitlines()[-1]) for _, out, _ in done)
    assert fast["rounds"] == slow["rounds"] == 16, (fast, slow)
    # Rank 1 applied several rounds in one step() (its gradients came late), ...
    assert slow["most"] >= 2 and slow["steps"] < fast["steps"], (fast, slow)
    # ... yet after every step both ranks' rate is the one of the rounds applied so far ...
    for rounds, lr in slow["lrs"].items():
        assert lr == pytest.approx(0.05 / (1 + int(rounds))), (rounds, slow["lrs"])
        if rounds in fast["lrs"]:
            assert lr == fast["lrs"][rounds], (rounds, fast["lrs"], slow["lrs"])
    # ... and every round was applied at the same rate: the models are identical.
    a, b = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    for key in a:
        assert torch.equal(a[key], b[key]), key


def run_rank1(address: str, tmp_path: pathlib.Path, steps: int, name: str) -> subprocess.Popen[str]:
    code = (
        "import torch, syncopate.torch as st\n"
        f"st.init('backup', workers=2, rank=1, backup_workers=1, address='{address}', log=lambda _: None,"
        " step_timeout_s=20.0)\n"
        "torch.manual_seed(1)\n"
        "m = torch.nn.Linear(4, 2)\n"
        "opt = st.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m)\n"
        f"for _ in range({steps}):\n"
        "    opt.zero_grad(); m(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()\n"
        "print('rounds', opt.rounds)\n"
        "st.shutdown()\n"
    )
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_worker_joining_after_round_0_is_refused_naming_the_cause(tmp_path: pathlib.Path) -> None:
    import syncopate.torch as st

    lines: list[str] = []
    port = free_port()
    address = f"127.0.0.1:{port}"
    first = run_rank1(address, tmp_path, 2, "first")
    try:
        st.init("backup", workers=2, rank=0, backup_workers=1, address=address, log=lines.append,
                time_limit_s=60.0, step_timeout_s=20.0)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)

        def steps(n: int) -> None:
            for _ in range(n):
                opt.zero_grad()
                model(torch.randn(8, 4)).pow(2).mean().backward()
                opt.step()

        steps(2)
        [(code, out, err)] = finish([first])
        assert code == 0 and "rounds" in out, err[-3000:]
        steps(3)  # rank 1 has left: the rounds go on without it
        late = run_rank1(address, tmp_path, 2, "late")
        [(code, out, err)] = finish([late], timeout_s=60.0)
        # Refused at DistributedOptimizer(...), with the cause and the way out named.
        assert code != 0, out + err[-3000:]
        assert "joined after round 0" in err and "start every rank before training" in err, err[-3000:]
        steps(2)  # rank 0 trains on: nothing waits for the refused worker
        report = st.shutdown(timeout_s=5.0)
    finally:
        st.shutdown(timeout_s=1.0)
        first.kill()
    assert report is not None and report["updates"] >= 7, report


def test_each_round_reaches_on_round_by_a_copy_not_a_python_object_per_parameter() -> None:
    """The worker's thread's CPU time from a gradient handed over to the next round's
    ``on_round`` (send, receive, the round's array made) at 4 M parameters: a copy and the
    socket's traffic take milliseconds; a Python float per parameter took a quarter of a
    second."""
    import threading
    import time

    import numpy as np

    import syncopate

    dim, rounds = 4_000_000, 7
    spent: list[float] = []
    handed: list[float] = []
    values: list[float] = []

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        grad.fill(0.5)
        handed.append(time.thread_time())
        return 1.0

    def on_round(vector: np.ndarray, version: int) -> None:
        if handed:
            spent.append(time.thread_time() - handed[-1])
        values.append(float(vector[-1]))
        assert vector.dtype == np.float32 and vector.shape == (dim,) and vector.flags.writeable

    def start(address: str) -> None:
        threading.Thread(target=lambda: syncopate.run_worker(address, compute, id=0, log=lambda _: None,
                                                             on_round=on_round), daemon=True).start()

    report = syncopate.serve(np.zeros(dim, dtype=np.float32), syncopate.Protocol("bsp", workers=1),
                             optimizer=syncopate.Optimizer("mean"), on_listen=start, log=lambda _: None,
                             updates=rounds, time_limit_s=60.0)
    assert report["updates"] == rounds
    assert values[1:] == [0.5] * (len(values) - 1), values  # the round's mean: the one gradient
    assert len(spent) >= rounds - 1, spent
    # The median: the first rounds also pay for the socket's and the allocator's first use.
    assert sorted(spent)[len(spent) // 2] < 0.1, f"CPU seconds per round on the worker's thread: {spent}"
