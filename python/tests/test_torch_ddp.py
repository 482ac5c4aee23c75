"""A DDP script converted to syncopate in at most 10 lines (python/examples/ddp_digits.py and
syncopate_digits.py), trained over TCP by 2 worker processes, started by hand and by
torchrun; and 2 workers' models (parameters and BatchNorm buffers) staying identical.

torch is required (see torch_required.py).
"""

from __future__ import annotations

import difflib
import pathlib
import re
import subprocess
import sys

import pytest
import ranks
from ranks import free_port, launch
from torch_required import require_torch

torch = require_torch()

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
HERE = pathlib.Path(__file__).resolve().parent
DDP, CONVERTED = EXAMPLES / "ddp_digits.py", EXAMPLES / "syncopate_digits.py"
#: The accuracy the converted script reaches on the digits test split (the DDP original
#: reaches it too; the test runs only the converted one).
TARGET = 0.90


def changed_lines(a: list[str], b: list[str]) -> int:
    """Lines replaced, inserted or deleted to turn ``a`` into ``b`` (a replaced block counts
    its longer side)."""
    ops = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def test_the_ddp_script_converts_by_changing_at_most_10_lines() -> None:
    ddp, converted = DDP.read_text().splitlines(), CONVERTED.read_text().splitlines()
    assert changed_lines(ddp, converted) <= 10, "\n".join(difflib.unified_diff(ddp, converted, lineterm=""))
    # The loop is the user's: clip, step, schedule, accumulation and the epoch's shuffle stay.
    for kept in ("clip_grad_norm_", "sched.step()", "% ACCUMULATE", "sampler.set_epoch(epoch)", "model.train()"):
        assert kept in "\n".join(converted)


def finish(procs: list[subprocess.Popen[str]], timeout_s: float = 120.0) -> list[str]:
    """Every process's stdout, each having exited with 0."""
    done = ranks.finish(procs, timeout_s)
    for code, _, err in done:
        assert code == 0, err[-3000:]
    return [out for _, out, _ in done]


def accuracies(text: str) -> dict[int, float]:
    # Two ranks share one stdout under torchrun: a line may run into the next rank's.
    return {int(r): float(a) for r, a in re.findall(r"rank (\d+): test accuracy (\d+(?:\.\d+)?)", text)}


def test_the_converted_script_trains_with_2_worker_processes_over_tcp() -> None:
    port = free_port()
    outs = finish([launch(rank, port, str(CONVERTED)) for rank in range(2)])
    found = accuracies("".join(outs))
    assert set(found) == {0, 1}, outs
    # BSP with the mean relayed: both ranks hold the same model.
    assert found[0] == found[1] >= TARGET, found


def test_the_converted_script_runs_under_torchrun() -> None:
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(CONVERTED)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    found = accuracies(run.stdout)
    assert set(found) == {0, 1} and found[0] == found[1] >= TARGET, run.stdout + run.stderr[-2000:]


@pytest.mark.parametrize("protocol", ["bsp", "backup"])
def test_two_workers_models_stay_identical_buffers_included(protocol: str, tmp_path: pathlib.Path) -> None:
    port = free_port()
    finish([launch(rank, port, str(HERE / "torch_identical_worker.py"), protocol, str(tmp_path)) for rank in range(2)])
    ra, rb = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert ra["rounds"] == rb["rounds"] == 12, (ra["rounds"], rb["rounds"])
    a, b = ra["model"], rb["model"]
    assert a.keys() == b.keys() and "1.running_mean" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    if protocol == "bsp":
        assert int(a["1.num_batches_tracked"]) == 24  # 12 steps of 2 forwards
    else:  # the slow worker's late gradients were dropped, yet it applied every round
        assert rb["steps"] < 12, rb["steps"]
    assert float(a["1.running_var"].sub(1).abs().max()) > 0.05  # the statistics moved


ASP_RANK = """
import sys, time
import torch
import syncopate.torch as st

if sys.argv[1] == "1":
    time.sleep(2.0)  # rank 1 starts late: rank 0 must wait for it before training
st.init("asp", lr=0.05, log=lambda _: None, time_limit_s=60.0)
torch.manual_seed(st.rank())
model = torch.nn.Linear(4, 2)
opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
for step in range(5):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
report = st.shutdown()
if report is not None:
    print(f"updates {report['updates']} reason {report['reason']} lost {sorted(report['lost_workers'])}")
"""


def test_under_asp_rank_0_waits_for_a_late_rank_and_for_it_to_leave(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "asp_rank.py"
    script.write_text(ASP_RANK)
    port = free_port()
    outs = finish([launch(rank, port, str(script), str(rank)) for rank in range(2)])
    # Every gradient of both ranks is an update under ASP: rank 0 neither trained alone
    # before rank 1 joined nor stopped the server before rank 1 had sent its last one.
    assert "updates 10 reason stopped lost [0, 1]" in outs[0], outs
