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
        on_round: Any = None, **options: Any) -> dict[str, Any]:
    """`serve` on `params` with one worker thread per `compute` (each with `on_round`, if
    given); returns the report. A minute at most."""
    results: dict[int, Any] = {}
    threads: list[threading.Thread] = []

    def start(address: str) -> None:
        for i, compute in enumerate(computes):
            def work(i: int = i, compute: Callable[..., Any] = compute) -> None:
                try:
                    results[i] = syncopate.run_worker(address, compute, id=i, log=lambda _: None,
                                                      on_round=on_round)
                except Exception as e:  # noqa: BLE001 - the test inspects it
                    results[i] = e
            t = threading.Thread(target=work, daemon=True)
            t.start()
            threads.append(t)

    report = syncopate.serve(params, protocol, on_listen=start, log=lambda _: None, time_limit_s=60.0, **options)
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
    run(protocol, params, [worker(i) for i in range(workers)], on_round=lambda vector, version: None,
        optimizer=syncopate.Optimizer("mean"), updates=rounds)
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


def test_on_round_gives_every_worker_every_rounds_mean_under_backup_workers() -> None:
    """Backup workers (b = 1, stragglers abort): a worker whose gradient a round did not need
    computes on the newest model only, but `on_round` still sees every round, in order, and
    every worker sees the same vectors; each is the exact mean of two gradients computed on
    the version before."""
    workers, rounds = 3, 15
    protocol = syncopate.Protocol("backup", workers=workers, lr=0.1, backup_workers=1)
    params = np.zeros(DIM, dtype=np.float32)
    seen: dict[int, list[tuple[int, np.ndarray]]] = {i: [] for i in range(workers)}
    sent: dict[tuple[int, int], np.ndarray] = {}
    # The first round closes only once every worker joined (a worker joining after it could
    # not apply it, and would end with an error: tested below).
    all_joined = threading.Barrier(workers)

    def worker(i: int) -> tuple[Callable[..., float], Callable[[np.ndarray, int], None]]:
        rng = np.random.default_rng(10 + i)

        def on_round(vector: np.ndarray, version: int) -> None:
            assert vector.dtype == np.float32 and vector.shape == (DIM,)
            seen[i].append((version, vector))
            if version == 0:
                all_joined.wait(30)

        def compute(p: np.ndarray, g: np.ndarray) -> float:
            if i == 2:
                threading.Event().wait(0.01)
            version, vector = seen[i][-1]
            assert np.array_equal(p, vector)
            g[:] = rng.standard_normal(DIM).astype(np.float32)
            sent[(i, version)] = g.copy()
            return 1.0

        return compute, on_round

    pairs = [worker(i) for i in range(workers)]
    results: dict[int, Any] = {}
    threads = []

    def start(address: str) -> None:
        for i, (compute, on_round) in enumerate(pairs):
            def work(i: int = i, compute: Any = compute, on_round: Any = on_round) -> None:
                try:
                    results[i] = syncopate.run_worker(address, compute, id=i, log=lambda _: None, on_round=on_round)
                except Exception as e:  # noqa: BLE001 - the test inspects it
                    results[i] = e
            t = threading.Thread(target=work, daemon=True)
            t.start()
            threads.append(t)

    report = syncopate.serve(params, protocol, on_listen=start, log=lambda _: None,
                             optimizer=syncopate.Optimizer("mean"), updates=rounds, time_limit_s=60.0)
    for t in threads:
        t.join(timeout=60)
    for i in range(workers):
        assert isinstance(results[i], dict), results[i]
        versions = [v for v, _ in seen[i]]
        assert versions == list(range(len(versions))) and len(versions) >= rounds, (i, versions)
    for v in range(1, rounds + 1):
        vectors = [dict(seen[i]).get(v) for i in range(workers)]
        present = [x for x in vectors if x is not None]
        assert len(present) >= 2 and all(np.array_equal(x, present[0]) for x in present), v
        on_previous = [g for (i, base), g in sent.items() if base == v - 1]
        means = [(a + b) / np.float32(2) for j, a in enumerate(on_previous) for b in on_previous[j + 1:]]
        assert any(np.array_equal(present[0], m) for m in means), v
    last = [dict(seen[i])[report["updates"]] for i in range(workers) if report["updates"] in dict(seen[i])]
    assert last and np.array_equal(params, last[0])


def test_on_round_must_be_callable() -> None:
    with pytest.raises(ValueError, match="on_round must be callable"):
        syncopate.run_worker("127.0.0.1:1", pull_to_target, id=0, on_round=3)


def test_a_worker_without_on_round_is_refused_by_a_mean_server() -> None:
    params = np.zeros(DIM, dtype=np.float32)
    results: dict[int, Any] = {}

    def start(address: str) -> None:
        def work() -> None:
            try:
                results[0] = syncopate.run_worker(address, pull_to_target, id=0, log=lambda _: None,
                                                  give_up_after_s=2.0)
            except Exception as e:  # noqa: BLE001 - the test inspects it
                results[0] = e
        threading.Thread(target=work, daemon=True).start()

    report = syncopate.serve(params, syncopate.Protocol("bsp", workers=1), optimizer=syncopate.Optimizer("mean"),
                             on_listen=start, log=lambda _: None, updates=5, time_limit_s=3.0)
    assert report["updates"] == 0
    assert isinstance(results.get(0), syncopate.WorkerError), results
    assert "pass on_round= to apply every round" in str(results[0])


def test_a_worker_that_joins_after_rounds_it_never_saw_ends_naming_them() -> None:
    """Backup b = 1: rounds close with two workers while the third has not joined; under
    on_round it cannot apply the rounds it missed, and says so."""
    protocol = syncopate.Protocol("backup", workers=3, lr=0.1, backup_workers=1)
    params = np.zeros(DIM, dtype=np.float32)
    results: dict[int, Any] = {}
    reached = threading.Event()

    def on_round_of(i: int) -> Callable[[np.ndarray, int], None]:
        def on_round(vector: np.ndarray, version: int) -> None:
            if version >= 3:
                reached.set()
        return on_round

    def compute(p: np.ndarray, g: np.ndarray) -> float:
        threading.Event().wait(0.002)
        g[:] = 1.0
        return 1.0

    def work(address: str, i: int) -> None:
        try:
            results[i] = syncopate.run_worker(address, compute, id=i, log=lambda _: None, on_round=on_round_of(i))
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[i] = e

    def start(address: str) -> None:
        for i in (0, 1):
            threading.Thread(target=work, args=(address, i), daemon=True).start()

        def late() -> None:
            reached.wait(30)
            work(address, 2)
        threading.Thread(target=late, daemon=True).start()

    syncopate.serve(params, protocol, optimizer=syncopate.Optimizer("mean"), on_listen=start, log=lambda _: None,
                    updates=400, time_limit_s=20.0)
    deadline = threading.Event()
    for _ in range(100):
        if 2 in results:
            break
        deadline.wait(0.1)
    error = results.get(2)
    assert isinstance(error, syncopate.WorkerError), error
    assert "on_round needs every round in order" in str(error) and "never reached this worker" in str(error)
