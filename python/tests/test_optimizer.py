"""`syncopate.Optimizer`: the server's update rule, and `serve(optimizer=)` running it over TCP
with `run_worker` workers in threads of this process."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import pytest

import syncopate

DIM = 6
TARGET = np.linspace(-1.0, 1.0, DIM).astype(np.float32)


def run(protocol: syncopate.Protocol, params: np.ndarray, computes: list[Callable[..., Any]],
        **options: Any) -> dict[str, Any]:
    """`serve` on `params` with one worker thread per `compute`; returns the report."""
    results: dict[int, Any] = {}
    threads: list[threading.Thread] = []

    def start(address: str) -> None:
        for i, compute in enumerate(computes):
            def work(i: int = i, compute: Callable[..., Any] = compute) -> None:
                try:
                    results[i] = syncopate.run_worker(address, compute, id=i, log=lambda _: None)
                except Exception as e:  # noqa: BLE001 - the test inspects it
                    results[i] = e
            t = threading.Thread(target=work, daemon=True)
            t.start()
            threads.append(t)

    report = syncopate.serve(params, protocol, on_listen=start, log=lambda _: None, **options)
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a worker did not end"
    for i, r in results.items():
        assert isinstance(r, dict), f"worker {i}: {r!r}"
    return report


def pull_to_target(params: np.ndarray, grad: np.ndarray) -> float:
    """The gradient of 0.5 * |params - TARGET|^2."""
    grad[:] = params - TARGET
    return float(0.5 * np.sum(grad * grad))


def test_settings_read_back_and_print() -> None:
    o = syncopate.Optimizer("adamw", betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01,
                            schedule="warmup-cosine:10:100")
    assert (o.rule, o.betas, o.eps, o.weight_decay) == ("adamw", (0.8, 0.99), 1e-6, 0.01)
    assert o.schedule == "warmup-cosine:10:100:0"
    assert repr(o) == ('Optimizer("adamw", betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, '
                       'schedule="warmup-cosine:10:100:0")')
    assert eval(repr(o), {"Optimizer": syncopate.Optimizer}) == o
    assert o == syncopate.Optimizer("adamw", betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01,
                                    schedule="warmup-cosine:10:100:0")
    assert o.state_len(10) == 2 * 10 + 40
    n = syncopate.Optimizer("nesterov", momentum=0.9, schedule="step:5:0.5")
    assert (n.rule, n.momentum, n.schedule) == ("nesterov", 0.9, "step:5:0.5")
    assert syncopate.Optimizer().rule == "sgd" and syncopate.Optimizer().schedule is None
    assert syncopate.Optimizer().state_len(10) == 0
    assert syncopate.Optimizer("mean").state_len(10) == 40
    assert repr(syncopate.Optimizer("mean")) == 'Optimizer("mean")'


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (("lamb",), {}, r"^rule 'lamb': expected one of sgd, momentum, nesterov, adamw, mean$"),
        (("momentum",), {"momentum": 1.0}, r"^momentum must be a number in \[0, 1\), got 1$"),
        (("momentum",), {"momentum": float("nan")}, r"^momentum must be"),
        (("nesterov",), {}, r"^momentum must be in \(0, 1\) for rule 'nesterov'$"),
        (("sgd",), {"momentum": 0.9}, r"^momentum applies to rules 'momentum' and 'nesterov' only"),
        (("adamw",), {"betas": (1.0, 0.999)}, r"^betas\[0\] must be a number in \[0, 1\)"),
        (("adamw",), {"betas": (0.9, -0.1)}, r"^betas\[1\] must be a number in \[0, 1\)"),
        (("adamw",), {"eps": 0.0}, r"^eps must be a finite number above 0"),
        (("adamw",), {"weight_decay": float("inf")}, r"^weight_decay must be a finite number"),
        (("sgd",), {"weight_decay": 0.1}, r"^weight_decay applies to rule 'adamw' only, not 'sgd'$"),
        (("momentum",), {"momentum": 0.5, "eps": 1e-3}, r"^eps applies to rule 'adamw' only"),
        (("sgd",), {"schedule": "cosine"}, r"^schedule 'cosine': expected constant, step:EVERY:GAMMA"),
        (("sgd",), {"schedule": "step:0:0.5"}, r"^schedule EVERY must be at least 1"),
        (("sgd",), {"schedule": "step:10:2"}, r"^schedule GAMMA must be in \(0, 1\]"),
        (("sgd",), {"schedule": "warmup-cosine:10:5"}, r"^schedule TOTAL must be at least WARMUP"),
        (("mean",), {"schedule": "step:10:0.5"}, r"^schedule is unused by rule 'mean'"),
    ],
)
def test_every_bad_knob_is_a_one_line_value_error_naming_it(args: tuple[Any, ...], kwargs: dict[str, Any],
                                                           message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        syncopate.Optimizer(*args, **kwargs)
    assert "\n" not in str(info.value)


def test_serve_refuses_optimizer_beside_momentum_and_mean_where_it_cannot_run() -> None:
    params = np.zeros(DIM, dtype=np.float32)
    bsp = syncopate.Protocol("bsp", workers=1)
    with pytest.raises(ValueError, match="^momentum: give either optimizer= or the momentum= shorthand"):
        syncopate.serve(params, bsp, optimizer=syncopate.Optimizer("adamw"), momentum=0.9, updates=1)
    for name in ("asp", "ssp", "bap", "wbsp", "grouped"):
        protocol = syncopate.Protocol(name, workers=2)
        with pytest.raises(ValueError, match=f"update rule `mean` does not run under protocol `{name}`"):
            syncopate.serve(params, protocol, optimizer=syncopate.Optimizer("mean"), updates=1)
    with pytest.raises(ValueError, match="^evaluate: under optimizer rule 'mean'"):
        syncopate.serve(params, bsp, optimizer=syncopate.Optimizer("mean"), evaluate=lambda v: 0.0, updates=1)


def adamw_reference(x0: np.ndarray, steps: int, lr: float, b1: float, b2: float, eps: float,
                    wd: float) -> np.ndarray:
    """PyTorch's AdamW (float64 here) on the gradient `x - TARGET`, `steps` times."""
    x = x0.astype(np.float64)
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    for t in range(1, steps + 1):
        g = x - TARGET
        x = x * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        x = x - (lr / (1 - b1**t)) * m / (np.sqrt(v) / np.sqrt(1 - b2**t) + eps)
    return x


def test_adamw_on_the_server_matches_pytorchs_update_rule() -> None:
    params = np.full(DIM, 0.5, dtype=np.float32)
    x0 = params.copy()
    optimizer = syncopate.Optimizer("adamw", betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    report = run(syncopate.Protocol("bsp", workers=1, lr=0.05), params, [pull_to_target],
                 optimizer=optimizer, updates=25)
    assert report["updates"] == 25
    expected = adamw_reference(x0, 25, 0.05, 0.8, 0.95, 1e-6, 0.1)
    np.testing.assert_allclose(params, expected, rtol=1e-5, atol=1e-6)
    # Not plain SGD's path: 25 steps of SGD at 0.05 leave a different model.
    sgd = x0.astype(np.float64)
    for _ in range(25):
        sgd -= 0.05 * (sgd - TARGET)
    assert np.max(np.abs(params - sgd)) > 1e-3


def test_a_step_schedule_halves_the_rate_every_update() -> None:
    params = np.zeros(DIM, dtype=np.float32)

    def ones(p: np.ndarray, g: np.ndarray) -> float:
        g[:] = 1.0
        return 1.0

    run(syncopate.Protocol("bsp", workers=1, lr=0.5), params, [ones],
        optimizer=syncopate.Optimizer("sgd", schedule="step:1:0.5"), updates=6)
    # x = -0.5 * (1 + 1/2 + ... + 1/32)
    np.testing.assert_allclose(params, -0.5 * sum(0.5**t for t in range(6)), rtol=1e-6)


@pytest.mark.parametrize("name", ["bsp", "backup", "dbw"])
def test_mean_publishes_each_rounds_exact_mean_gradient(name: str) -> None:
    """Under rule "mean" every round's published vector is the bit-exact mean of the round's
    gradients (float32), whatever the learning rate; version 0 is the initial model."""
    workers = 2
    kwargs: dict[str, Any] = {"backup_workers": 0} if name == "backup" else {}
    if name == "dbw":
        kwargs = {"k_min": workers}
    protocol = syncopate.Protocol(name, workers=workers, lr=0.37, **kwargs)
    initial = np.arange(DIM, dtype=np.float32) + 100.0
    params = initial.copy()
    received: dict[int, list[np.ndarray]] = {i: [] for i in range(workers)}
    sent: dict[int, list[np.ndarray]] = {i: [] for i in range(workers)}

    def worker(i: int) -> Callable[[np.ndarray, np.ndarray], float]:
        rng = np.random.default_rng(i)

        def compute(p: np.ndarray, g: np.ndarray) -> float:
            received[i].append(p.copy())
            g[:] = rng.standard_normal(DIM).astype(np.float32)
            sent[i].append(g.copy())
            return 1.0

        return compute

    rounds = 12
    run(protocol, params, [worker(i) for i in range(workers)], optimizer=syncopate.Optimizer("mean"),
        updates=rounds)
    for i in range(workers):
        assert np.array_equal(received[i][0], initial)
        assert len(received[i]) >= rounds
    for r in range(rounds):
        mean = (sent[0][r] + sent[1][r]) / np.float32(workers)
        assert mean.dtype == np.float32
        for i in range(workers):
            if r + 1 < len(received[i]):
                assert np.array_equal(received[i][r + 1], mean), (i, r)
    last = (sent[0][rounds - 1] + sent[1][rounds - 1]) / np.float32(workers)
    assert np.array_equal(params, last)
