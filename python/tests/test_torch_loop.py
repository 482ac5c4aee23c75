"""The unchanged-loop API (syncopate.torch.init / DistributedOptimizer / shutdown) in one
process: one worker, the server hosted in a thread of the test's process. Every run is
bounded (the server's time limit, the test's own timeouts): a failure never hangs.

torch is required (see torch_required.py).
"""

from __future__ import annotations

import pathlib
import re
import socket
import subprocess
import sys
import threading
from typing import Any, Iterator

import pytest
from torch_required import require_torch

torch = require_torch()

import syncopate
import syncopate.torch as st


class Lines:
    """The server's log lines, and a wait for one that contains a text."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()

    def __call__(self, line: str) -> None:
        with self._changed:
            self.lines.append(line)
            self._changed.notify_all()

    def wait_for(self, text: str, timeout_s: float = 10.0) -> str:
        with self._changed:
            found = self._changed.wait_for(lambda: any(text in line for line in self.lines), timeout_s)
        assert found, f"no server line with {text!r} within {timeout_s} s: {self.lines}"
        return next(line for line in self.lines if text in line)


@pytest.fixture(autouse=True)
def clean_session(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (*syncopate.RANK_VARIABLES, *syncopate.WORLD_SIZE_VARIABLES, "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    yield
    st.shutdown(timeout_s=2.0)


def one_worker(protocol: str = "bsp", **options: Any) -> st.Session:
    options.setdefault("time_limit_s", 60.0)
    return st.init(protocol, workers=1, rank=0, address="127.0.0.1:0", log=options.pop("log", lambda _: None),
                   **options)


def mlp(seed: int = 0, batch_norm: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(8, 16)]
    if batch_norm:
        layers.append(torch.nn.BatchNorm1d(16))
    layers += [torch.nn.ReLU(), torch.nn.Linear(16, 3)]
    return torch.nn.Sequential(*layers)


def batch(seed: int, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def test_one_worker_under_bsp_applies_the_mean_with_the_wrapped_optimizer_exactly() -> None:
    # One worker: the round's mean is its own gradient, so the run must equal plain AdamW.
    model, reference = mlp(), mlp()
    one_worker()
    inner = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    opt = st.DistributedOptimizer(inner, model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.01, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda s: min(1.0, (s + 1) / 3))
    for step in range(6):
        for m, o, s in ((model, opt, sched), (reference, ref_opt, ref_sched)):
            o.zero_grad()
            for micro in range(2):  # gradient accumulation
                x, y = batch(10 * step + micro)
                loss = torch.nn.functional.cross_entropy(m(x), y) / 2
                loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            o.step(**({"loss": loss} if o is opt else {}))
            s.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] == 0.01
    report = st.shutdown()
    assert report is not None and report["updates"] == 6, report
    assert [round(v, 5) for _, _, v in report["losses"]][:1] != [], report["losses"]


def test_step_before_backward_leaves_the_server_and_names_the_cause() -> None:
    lines = Lines()
    model = mlp()
    one_worker(log=lines)
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    with pytest.raises(ValueError, match=r"step\(\) before backward"):
        opt.step()
    lines.wait_for("worker 0 lost")
    with pytest.raises(RuntimeError, match="this worker has left the server"):
        opt.step()


def test_a_nan_gradient_is_refused_naming_the_parameter() -> None:
    lines = Lines()
    model = mlp()
    one_worker(log=lines)
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    x, y = batch(0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    model[2].bias.grad[1] = float("inf")
    with pytest.raises(ValueError, match="gradient of parameter 2.bias has NaN or infinity"):
        opt.step()
    lines.wait_for("worker 0 lost")


@pytest.mark.parametrize(
    ("dtype", "message"),
    [(torch.bfloat16, "parameter 0.weight is torch.bfloat16: .* torch.autocast"),
     (torch.float16, "parameter 0.weight is torch.float16"),
     (torch.float64, "parameter 0.weight is torch.float64, not float32")],
)
def test_parameters_that_are_not_float32_are_refused(dtype: torch.dtype, message: str) -> None:
    model = mlp().to(dtype)
    one_worker()
    with pytest.raises(ValueError, match=message):
        st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)


def test_a_non_float_parameter_and_parameters_on_two_devices_are_refused() -> None:
    model = mlp()
    model.register_parameter("count", torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False))
    one_worker()
    with pytest.raises(ValueError, match="parameter count is torch.int64, not float32"):
        st.DistributedOptimizer(torch.optim.SGD(mlp().parameters(), lr=0.1), model)
    split = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    with pytest.raises(ValueError, match=r"two devices \(0.weight on cpu, 1.weight on meta\)"):
        st.DistributedOptimizer(torch.optim.SGD(split.parameters(), lr=0.1), split)


def test_an_optimizer_over_another_models_parameters_is_refused() -> None:
    model = mlp()
    one_worker()
    with pytest.raises(ValueError, match=r"parameter group 0 of the optimizer holds a tensor of shape \(16, 8\)"):
        st.DistributedOptimizer(torch.optim.SGD(mlp(1).parameters(), lr=0.1), model)


def test_a_world_size_other_than_the_protocols_workers_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"\$WORLD_SIZE=3 but the protocol runs 2 workers"):
        st.init("bsp", workers=2, address="127.0.0.1:0")


def test_a_torch_lr_scheduler_under_an_asynchronous_protocol_is_refused() -> None:
    lines = Lines()
    model = mlp()
    one_worker("asp", log=lines)
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    x, y = batch(0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(ValueError, match="learning rate of parameter group 0 is scheduled .* under asp"):
        opt.step()
    lines.wait_for("worker 0 lost")


def test_under_asp_the_servers_optimizer_makes_the_update_and_the_host_keeps_the_final_model() -> None:
    model = mlp()
    start = [p.detach().clone() for p in model.parameters()]
    one_worker("asp", lr=0.1)
    inner = torch.optim.SGD(model.parameters(), lr=123.0)  # never called under asp
    opt = st.DistributedOptimizer(inner, model)
    x, y = batch(0)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    opt.step()
    # Plain SGD at the server's lr 0.1, not the wrapped optimizer's 123.
    for p, p0, g in zip(model.parameters(), start, grads):
        torch.testing.assert_close(p.detach(), p0 - 0.1 * g)
    report = st.shutdown()
    assert report is not None and report["updates"] >= 1


def test_should_stop_once_the_server_stops_and_step_then_sends_nothing() -> None:
    model = mlp()
    one_worker(updates=3)
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    steps = 0
    while not opt.should_stop:
        assert steps < 10, "the server's bound of 3 updates must stop the run"
        opt.zero_grad()
        x, y = batch(steps)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
    # The step that finds the run stopped sends nothing: the 3 updates came from 3 or (when
    # the third update's model came back before the stop) 4 steps.
    assert steps in (3, 4)
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()  # after the stop: nothing sent, nothing changed
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    report = st.shutdown()
    assert report is not None and report["updates"] == 3 and report["reason"] == "updates"


def test_bf16_autocast_with_float32_parameters_trains_and_eval_mode_is_kept() -> None:
    model = mlp(batch_norm=True)
    one_worker()
    opt = st.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.02), model)
    losses = []
    model.eval()  # the user's mode: never switched by step()
    for step in range(30):
        opt.zero_grad()
        x, y = batch(step % 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        losses.append(float(loss.detach()))
        assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(losses[-4:]) < 0.8 * sum(losses[:4]), losses


def test_batchnorm_buffers_travel_with_the_mean_and_are_in_the_state_dict() -> None:
    model = mlp(batch_norm=True)
    one_worker()
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    bn = model[1]
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step)
        torch.nn.functional.cross_entropy(model(x + 3.0), y).backward()
        opt.step()
    # One worker: the mean of the buffers is its own, running statistics of 3 forwards.
    assert int(bn.num_batches_tracked) == 3
    assert float(bn.running_mean.abs().max()) > 0.1
    state = model.state_dict()
    assert torch.equal(state["1.running_mean"], bn.running_mean)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_model_trains_with_staging_through_pinned_memory() -> None:
    model, reference = mlp().cuda(), mlp().cuda()
    one_worker()
    opt = st.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01), model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.01)
    for step in range(5):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            x, y = batch(step)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(m(x.cuda()), y.cuda())
            loss.backward()
            o.step()
    torch.cuda.synchronize()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.device.type == "cuda"
        torch.testing.assert_close(p, q)


def test_the_staging_path_of_a_gpu_model_runs_on_the_cpu_and_trains_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CUDA test needs a GPU; the staging code it runs (host buffers apart from the
    # model's tensors, copies out after backward and in before the next forward) runs here.
    from syncopate.torch import _layout

    monkeypatch.setattr(_layout, "STAGE_CPU", True)
    model, reference = mlp(batch_norm=True), mlp(batch_norm=True)
    one_worker()
    opt = st.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01), model)
    assert opt._layout.staged and not opt._layout.sent.is_pinned()
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.01)
    for step in range(5):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            x, y = batch(step)
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name
    x, y = batch(0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    model[0].weight.grad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="gradient of parameter 0.weight has NaN or infinity"):
        opt.step()


def test_the_host_waits_for_every_worker_to_connect_and_no_longer() -> None:
    model = mlp()
    st.init("bsp", workers=2, rank=0, address="127.0.0.1:0", log=lambda _: None, connect_timeout_s=1.0,
            time_limit_s=30.0)
    with pytest.raises(TimeoutError, match=r"1 of 2 workers did not connect within connect_timeout_s=1.0 s"):
        st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)


def test_a_worker_refused_at_wrap_time_leaves_and_the_round_it_stalls_times_out(tmp_path: pathlib.Path) -> None:
    lines = Lines()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    rank1 = (
        "import torch, syncopate.torch as st\n"
        f"st.init('bsp', workers=2, rank=1, address='{address}', log=lambda _: None)\n"
        "m = torch.nn.Linear(2, 2).to(torch.bfloat16)\n"
        "st.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m)\n"
    )
    worker1 = subprocess.Popen([sys.executable, "-c", rank1], stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        model = mlp()
        st.init("bsp", workers=2, rank=0, address=address, log=lines, step_timeout_s=2.0, time_limit_s=60.0,
                connect_timeout_s=60.0)
        opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        _, err = worker1.communicate(timeout=120)
    finally:
        worker1.kill()
    assert worker1.returncode != 0 and "parameter weight is torch.bfloat16" in err, err[-2000:]
    lines.wait_for("worker 1 lost")
    x, y = batch(0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(TimeoutError, match="step_timeout_s=2.0"):
        opt.step()  # the round waits for worker 1, which left


def test_a_stated_server_schedule_keeps_the_torch_scheduler_line_under_asp() -> None:
    model = mlp()
    start = [p.detach().clone() for p in model.parameters()]
    one_worker("asp", lr=0.1, optimizer=syncopate.Optimizer("sgd", schedule="step:1:0.5"))
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, server_schedule=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    grads = []
    for step in range(2):
        opt.zero_grad()
        x, y = batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        opt.step()
        sched.step()
    # The server's schedule made the updates: lr 0.1, then 0.05.
    for p, p0, g0, g1 in zip(model.parameters(), start, *grads):
        torch.testing.assert_close(p.detach(), p0 - 0.1 * g0 - 0.05 * g1)


@pytest.mark.parametrize("optimizer", [None, "sgd"])
def test_a_server_schedule_stated_for_a_server_without_one_is_refused(optimizer: Any) -> None:
    model = mlp()
    one_worker("ssp", **({} if optimizer is None else {"optimizer": syncopate.Optimizer(optimizer)}))
    what = "the default SGD" if optimizer is None else "syncopate.Optimizer('sgd')"
    with pytest.raises(ValueError, match=re.escape(f"server_schedule=True, but the server's optimizer ({what}) has no "
                                                   "schedule") + ".* under ssp a torch LR scheduler cannot change"):
        st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, server_schedule=True)


def test_the_schedulers_stepped_for_missed_rounds_are_the_outermost_ones() -> None:
    # A worker catching up steps the schedulers built on its optimizer between rounds
    # (test_torch_rounds.py runs that); a SequentialLR steps the one it holds, itself.
    model = mlp()
    one_worker()
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    warm = torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    both = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[2])
    other = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(mlp(1).parameters(), lr=0.1), 1)  # not this one's
    assert opt._schedulers() == [both] and other.optimizer is not opt


def test_server_false_under_torchrun_needs_the_servers_address(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("TORCHELASTIC_USE_AGENT_STORE", "True"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29500"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=r"server=False under torchrun: \$MASTER_PORT is torchrun's own store"):
        st.init("asp", server=False)
