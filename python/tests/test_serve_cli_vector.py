"""`syncopate serve` (the CLI binary) on a vector of the application's own: from a `.npy`
file (`--init`) or from worker 0 (`--init-from-worker`, Python's `run_worker(initial=)`),
saved with `--save`, with NumPy least-squares workers."""

from __future__ import annotations

import json
import pathlib
import subprocess
import threading
from typing import Any

import numpy as np
import pytest

import syncopate

TARGET = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
LR = 0.25


def least_squares(p: np.ndarray, g: np.ndarray) -> float:
    g[:] = p - TARGET
    return float(0.5 * np.dot(g, g))


def serve(binary: pathlib.Path, args: list[str]) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen([str(binary), "serve", "--listen", "127.0.0.1:0", "--json", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    for line in server.stderr:
        if "listening on " in line:
            address = line.split("listening on ")[1].split()[0].rstrip(",")
            # Keep draining the log so the server never blocks on a full pipe.
            threading.Thread(target=server.stderr.read, daemon=True).start()
            return server, address
    raise AssertionError(f"the server never listened (exit {server.wait()})")


def run_workers(address: str, initial: Any = None) -> list[Any]:
    results: list[Any] = [None, None]

    def run(rank: int) -> None:
        try:
            extra = {"initial": initial} if rank == 0 and initial is not None else {}
            results[rank] = syncopate.run_worker(address, least_squares, id=rank, log=lambda line: None, **extra)
        except Exception as e:  # noqa: BLE001 (the test inspects it)
            results[rank] = e

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def expected(initial: np.ndarray, updates: int) -> np.ndarray:
    # BSP with both workers at the same model: w_v - target = (1 - lr)^v (w_0 - target).
    return TARGET + (1.0 - LR) ** updates * (initial - TARGET)


@pytest.mark.parametrize("source", ["file", "worker", "worker-callable"])
def test_serve_trains_a_vector_from_a_file_or_worker_0_and_saves_it(syncopate_bin, tmp_path, source) -> None:
    initial = np.array([9.0, -3.0, 5.0, 0.5], dtype=np.float32)
    saved = tmp_path / "out.npy"
    common = ["--workers", "2", "--lr", str(LR), "--steps", "12", "--save", str(saved), "--target-loss", "1.0"]
    if source == "file":
        np.save(tmp_path / "init.npy", initial)
        server, address = serve(syncopate_bin, [*common, "--init", str(tmp_path / "init.npy")])
        results = run_workers(address)
    else:
        server, address = serve(syncopate_bin, [*common, "--init-from-worker", "--dim", "4"])
        results = run_workers(address, initial=(lambda: initial) if source == "worker-callable" else initial)
    out, _ = server.communicate(timeout=60)
    assert server.returncode == 0, out
    assert all(isinstance(r, dict) and r["stopped"] for r in results), results
    summary = json.loads(out)
    assert summary["updates"] == 12
    curve = summary["loss_curve"]
    assert [p["version"] for p in curve["points"]] == list(range(1, 13))
    first_loss = 0.5 * float(np.sum((initial - TARGET) ** 2))
    assert curve["points"][0]["loss"] == pytest.approx(first_loss, rel=1e-5), "the first update saw the initial model"
    np.testing.assert_allclose(np.load(saved), expected(initial, 12), rtol=1e-5, atol=1e-5)


def test_worker_0_with_initial_parameters_of_another_size_or_not_finite_ends_with_the_reason(syncopate_bin) -> None:
    server, address = serve(syncopate_bin, ["--workers", "1", "--init-from-worker", "--dim", "4", "--time-limit", "3"])
    with pytest.raises(syncopate.WorkerError, match="initial has 3 elements; the server's model has 4 parameters"):
        syncopate.run_worker(address, least_squares, id=0, initial=lambda: np.zeros(3, np.float32), log=lambda _: None)
    bad = np.array([0.0, np.nan, 0.0, 0.0], dtype=np.float32)
    with pytest.raises(syncopate.WorkerError, match="parameter 1 is NaN: the initial parameters must be finite"):
        syncopate.run_worker(address, least_squares, id=0, initial=bad, log=lambda _: None)
    with pytest.raises(syncopate.WorkerError, match="pass initial="):
        syncopate.run_worker(address, least_squares, id=0, log=lambda _: None)
    server.communicate(timeout=30)


def test_serve_records_a_trace_of_the_python_workers_step_times_and_losses(syncopate_bin, tmp_path) -> None:
    """`serve --record-trace`: each Python worker's measured step time (worker 1 sleeps
    20 ms in its compute), its reported loss and its gradient's norms, one row per step."""
    import time

    np.save(tmp_path / "init.npy", np.zeros(4, dtype=np.float32))
    trace = tmp_path / "trace.csv"
    server, address = serve(syncopate_bin, ["--workers", "2", "--lr", str(LR), "--steps", "10",
                                            "--init", str(tmp_path / "init.npy"), "--record-trace", str(trace)])
    results: list[Any] = [None, None]

    def run(rank: int) -> None:
        def compute(p: np.ndarray, g: np.ndarray) -> float:
            if rank == 1:
                time.sleep(0.02)
            return least_squares(p, g)

        results[rank] = syncopate.run_worker(address, compute, id=rank, log=lambda line: None)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    out, _ = server.communicate(timeout=60)
    assert server.returncode == 0, out
    lines = trace.read_text().splitlines()
    assert lines[0] == "worker,step,seconds,loss,grad_norm,mean_norm,mean_of"
    rows = [line.split(",") for line in lines[1:]]
    assert len(rows) == json.loads(out)["ledger"]["received"]
    for rank in (0, 1):
        mine = [r for r in rows if r[0] == str(rank)]
        assert [int(r[1]) for r in mine] == list(range(len(mine))) and len(mine) >= 10
        assert all(float(r[2]) > 0 for r in mine)
    assert all(float(r[2]) >= 0.02 for r in rows if r[0] == "1"), "worker 1's sleep is in its step time"
    # BSP: both gradients of a version are on one model; the loss is 0.5 |g|^2 here.
    for r in rows:
        loss, norm = float(r[3]), float(r[4])
        assert loss == pytest.approx(0.5 * norm * norm, rel=1e-4)
        assert r[6] == "2"
