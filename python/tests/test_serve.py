"""`syncopate.serve` (the TCP server on a NumPy array) with `syncopate.run_worker` workers
that learn the protocol and the model's size from the server. Workers run in threads of
this process: both sides release the GIL while they wait."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any, Callable

import numpy as np
import pytest

import syncopate

DIM = 8
TRUE_W = np.arange(1, DIM + 1, dtype=np.float32) / DIM


def least_squares(seed: int) -> Callable[[np.ndarray, np.ndarray], float]:
    """A worker's `compute`: minibatch gradient of 0.5 * mean((x @ w - y)^2), returning the loss."""
    rng = np.random.default_rng(seed)

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        x = rng.standard_normal((16, DIM)).astype(np.float32)
        r = x @ params - x @ TRUE_W
        grad[:] = x.T @ r / len(r)
        return float(0.5 * np.mean(r * r))

    return compute


def slowly(compute: Callable[[np.ndarray, np.ndarray], float]) -> Callable[[np.ndarray, np.ndarray], float]:
    """`compute` taking at least 2 ms a step, so a run outlasts the other workers' start."""

    def slow(params: np.ndarray, grad: np.ndarray) -> float:
        threading.Event().wait(0.002)
        return compute(params, grad)

    return slow


def distance(params: np.ndarray) -> float:
    return float(np.linalg.norm(params - TRUE_W))


class Cluster:
    """`serve` in the calling thread, one thread per worker started once it listens."""

    def __init__(self, computes: list[Callable[..., Any]], **worker_options: Any) -> None:
        self.computes = computes
        self.worker_options = worker_options
        self.threads: list[threading.Thread] = []
        self.results: dict[int, Any] = {}
        self.address = ""

    def start(self, address: str) -> None:
        self.address = address
        for i, compute in enumerate(self.computes):
            t = threading.Thread(target=self._run, args=(i, compute), daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self, i: int, compute: Callable[..., Any]) -> None:
        try:
            self.results[i] = syncopate.run_worker(self.address, compute, id=i, log=lambda _: None,
                                                   **self.worker_options)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            self.results[i] = e

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a worker did not end"


def serve(protocol: syncopate.Protocol, cluster: Cluster, params: np.ndarray, **options: Any) -> dict[str, Any]:
    report = syncopate.serve(params, protocol, on_listen=cluster.start, log=lambda _: None, **options)
    cluster.join()
    return report


def test_momentum_moves_the_model_further_than_plain_sgd() -> None:
    distances = []
    for momentum in (0.0, 0.5):
        params = np.zeros(DIM, dtype=np.float32)
        cluster = Cluster([least_squares(10)])
        serve(syncopate.Protocol("bsp", workers=1, lr=0.02), cluster, params, momentum=momentum, updates=40)
        distances.append(distance(params))
    assert distances[1] < distances[0], distances


@pytest.mark.parametrize("name", ["bsp", "asp", "dbw", "backup", "ssp"])
def test_workers_learn_the_run_from_the_server_and_train_the_live_array(name: str) -> None:
    protocol = syncopate.Protocol(name, workers=2, lr=0.2)
    params = np.zeros(DIM, dtype=np.float32)
    cluster = Cluster([least_squares(1), least_squares(2)])
    seen: list[int] = []

    def evaluate(model: np.ndarray) -> float:
        # A read-only view of the live model (not a copy).
        assert np.shares_memory(model, params) and not model.flags.writeable
        seen.append(1)
        return distance(model)

    report = serve(protocol, cluster, params, evaluate=evaluate, every=10, updates=300)
    assert report["reason"] == "updates"
    assert report["updates"] >= 300
    assert distance(params) < 0.05, distance(params)
    assert len(report["evaluations"]) == len(seen) >= 29
    versions = [v for v, _, _ in report["evaluations"]]
    assert versions == sorted(versions) and all(v % 10 == 0 for v in versions)
    assert report["evaluation"] == report["evaluations"][-1][2]
    # The loss curve: the mean of each update's reported losses, falling as the model learns.
    # Updates made before the run's clock started (every worker connected) are not on it: a
    # protocol that trains with the workers it has may make many of them first.
    losses = report["losses"]
    assert len(losses) >= (250 if name == "bsp" else 100), len(losses)
    assert all(np.isfinite(loss) and t >= 0 for _, t, loss in losses)
    assert np.mean([loss for _, _, loss in losses[-20:]]) < 0.1 * np.mean([loss for _, _, loss in losses[:5]])
    for i in range(2):
        result = cluster.results[i]
        assert isinstance(result, dict), result
        assert result["stopped"] and result["steps"] > 0
        assert f"{name}" in result["run"] and np.isfinite(result["last_loss"])


def test_record_trace_writes_each_workers_step_times_and_gradient_columns(tmp_path) -> None:
    """`serve(record_trace=)`: one row per step, the slow worker's 2 ms wait in its times."""
    path = tmp_path / "trace.csv"
    params = np.zeros(DIM, dtype=np.float32)
    cluster = Cluster([least_squares(1), slowly(least_squares(2))])
    report = serve(syncopate.Protocol("bsp", workers=2, lr=0.2), cluster, params, updates=30,
                   record_trace=str(path))
    lines = path.read_text().splitlines()
    assert lines[0] == "worker,step,seconds,loss,grad_norm,mean_norm,mean_of"
    rows = [line.split(",") for line in lines[1:]]
    assert report["trace_steps"] == len(rows) >= 60
    assert all(float(r[2]) >= 0.002 for r in rows if r[0] == "1")
    assert all(r[3] and r[4] and r[6] == "2" for r in rows), rows[0]
    with pytest.raises(ValueError, match="cannot create the trace file"):
        syncopate.serve(params, syncopate.Protocol("bsp", workers=1, lr=0.2), updates=1,
                        record_trace=str(tmp_path / "no" / "such" / "dir.csv"))


def test_a_target_stops_the_run_and_times_exclude_evaluations() -> None:
    protocol = syncopate.Protocol("bsp", workers=2, lr=0.2)
    params = np.zeros(DIM, dtype=np.float32)
    cluster = Cluster([least_squares(3), least_squares(4)])

    def slow_distance(model: np.ndarray) -> float:
        threading.Event().wait(0.02)
        return -distance(model)

    report = serve(protocol, cluster, params, evaluate=slow_distance, every=5, target=-0.1, updates=10_000)
    assert report["reason"] == "target"
    assert -report["evaluation"] <= 0.1
    assert report["updates"] < 10_000
    assert report["eval_s"] >= 0.02 * len(report["evaluations"]) * 0.9
    assert report["time_to_target_s"] <= report["wall_s"] + 1e-9
    times = [t for _, t, _ in report["evaluations"]]
    assert times == sorted(times)


def test_a_compute_that_returns_a_non_number_ends_that_worker_and_the_server_loses_it() -> None:
    protocol = syncopate.Protocol("asp", workers=2, lr=0.1)
    params = np.zeros(DIM, dtype=np.float32)
    good = slowly(least_squares(5))
    steps = 0

    def forgets_the_loss(p: np.ndarray, g: np.ndarray) -> Any:
        nonlocal steps
        steps += 1
        good(p, g)
        return None if steps > 3 else 1.0

    cluster = Cluster([forgets_the_loss, good])
    report = serve(protocol, cluster, params, updates=200)
    error = cluster.results[0]
    assert isinstance(error, syncopate.WorkerError), error
    assert "worker 0: compute returned NoneType, not a finite number" in str(error)
    assert "counted as lost" in str(error)
    assert report["lost_workers"] == [0]
    assert report["lost"] >= 1
    assert isinstance(cluster.results[1], dict) and cluster.results[1]["stopped"]


def test_a_compute_that_raises_ends_that_worker_with_the_exception_as_cause() -> None:
    protocol = syncopate.Protocol("asp", workers=2, lr=0.1)
    params = np.zeros(DIM, dtype=np.float32)

    def broken(p: np.ndarray, g: np.ndarray) -> float:
        raise KeyError("no such batch")

    cluster = Cluster([broken, slowly(least_squares(6))])
    report = serve(protocol, cluster, params, updates=100)
    error = cluster.results[0]
    assert isinstance(error, syncopate.WorkerError), error
    assert "worker 0: compute raised KeyError: 'no such batch'" in str(error)
    assert isinstance(error.__cause__, KeyError)
    assert report["lost_workers"] == [0]


def test_a_worker_whose_model_has_another_size_is_refused_naming_both_sizes() -> None:
    protocol = syncopate.Protocol("asp", workers=1, lr=0.1)
    params = np.zeros(DIM, dtype=np.float32)
    wrong = np.zeros(DIM + 3, dtype=np.float32)
    cluster = Cluster([least_squares(7)], params=wrong)
    lines: list[str] = []
    report = syncopate.serve(params, protocol, on_listen=cluster.start, log=lines.append, time_limit_s=3.0)
    cluster.join()
    error = cluster.results[0]
    assert isinstance(error, syncopate.WorkerError), error
    both = f"the server's model has {DIM} parameters, worker 0's has {DIM + 3}"
    assert both in str(error)
    assert any(both in line for line in lines), lines
    assert report["updates"] == 0
    with pytest.raises(ValueError, match="params has 8 elements and grad 9"):
        syncopate.run_worker("127.0.0.1:1", least_squares(7), id=0, params=params, grad=np.zeros(DIM + 1, np.float32))


def test_the_caller_s_arrays_are_written_and_read_in_place() -> None:
    protocol = syncopate.Protocol("bsp", workers=1, lr=0.2)
    params = np.zeros(DIM, dtype=np.float32)
    mine_p, mine_g = np.zeros(DIM, dtype=np.float32), np.zeros(DIM, dtype=np.float32)
    inner = least_squares(8)

    def compute(p: np.ndarray, g: np.ndarray) -> float:
        assert p is mine_p and g is mine_g
        return inner(p, g)

    cluster = Cluster([compute], params=mine_p, grad=mine_g)
    serve(protocol, cluster, params, updates=50)
    assert isinstance(cluster.results[0], dict), cluster.results[0]


def test_the_worker_id_comes_from_the_launcher_s_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in syncopate.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="no worker id"):
        syncopate.worker_id_from_env()
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert syncopate.worker_id_from_env() == 3
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    assert syncopate.worker_id_from_env() == 2
    monkeypatch.setenv("RANK", "1")
    assert syncopate.worker_id_from_env() == 1
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match=r"\$RANK is 'x'"):
        syncopate.worker_id_from_env()


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "give a bound"),
        ({"updates": 5, "every": 0}, "every must be at least 1"),
        ({"target": 0.5}, "a target needs an evaluate function"),
        ({"time_limit_s": -1.0}, "time_limit_s must be positive"),
        ({"updates": 5, "momentum": 1.0}, "momentum 1"),
    ],
)
def test_serve_refuses_bad_settings(options: dict[str, Any], message: str) -> None:
    protocol = syncopate.Protocol("bsp", workers=1)
    with pytest.raises(ValueError, match=message):
        syncopate.serve(np.zeros(DIM, dtype=np.float32), protocol, **options)


def test_serve_refuses_a_model_that_is_not_float32_or_not_finite() -> None:
    protocol = syncopate.Protocol("bsp", workers=1)
    with pytest.raises(ValueError, match="float32"):
        syncopate.serve(np.zeros(DIM, dtype=np.float64), protocol, updates=1)
    bad = np.zeros(DIM, dtype=np.float32)
    bad[2] = np.nan
    with pytest.raises(ValueError, match=r"params\[2\] is not finite"):
        syncopate.serve(bad, protocol, updates=1)


def test_the_package_works_without_torch() -> None:
    # torch made unimportable: `import syncopate` and a run must not need it.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, syncopate\n"
        "assert sys.modules['torch'] is None\n"
        "print(syncopate.Protocol('bsp', workers=1).name)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "bsp"


def test_a_loss_that_is_not_finite_ends_that_worker() -> None:
    protocol = syncopate.Protocol("asp", workers=2, lr=0.1)
    params = np.zeros(DIM, dtype=np.float32)
    good = slowly(least_squares(9))

    def diverged(p: np.ndarray, g: np.ndarray) -> float:
        good(p, g)
        return float("nan")

    cluster = Cluster([diverged, good])
    report = serve(protocol, cluster, params, updates=100)
    error = cluster.results[0]
    assert isinstance(error, syncopate.WorkerError), error
    assert "worker 0: compute returned a loss of NaN, not a finite number" in str(error)
    assert report["lost_workers"] == [0]
