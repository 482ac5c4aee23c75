"""The two native hooks syncopate.torch's own-loop API stands on (no torch needed):
``serve(stop_when=)``, with which the host stops its server once every worker has joined and
left, and ``run_worker(optional_loss=True)``, with which a gradient travels without a loss."""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import numpy as np
import pytest

import syncopate


def run(compute: Callable[[np.ndarray, np.ndarray], Any], stop_when: Callable[[int, int], object],
        **worker_options: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``serve`` (1 worker, BSP) in this thread and one worker thread; both reports."""
    results: dict[str, Any] = {}

    def start(address: str) -> None:
        def work() -> None:
            try:
                results["worker"] = syncopate.run_worker(address, compute, id=0, log=lambda _: None, **worker_options)
            except Exception as e:  # noqa: BLE001 - the test inspects it
                results["worker"] = e

        results["thread"] = threading.Thread(target=work, daemon=True)
        results["thread"].start()

    params = np.zeros(4, dtype=np.float32)
    report = syncopate.serve(params, syncopate.Protocol("bsp", workers=1, lr=0.1), on_listen=start,
                             log=lambda _: None, time_limit_s=30.0, stop_when=stop_when)
    results["thread"].join(timeout=30)
    assert not results["thread"].is_alive(), "the worker did not end"
    return report, results["worker"]


def test_stop_when_sees_the_workers_join_and_stops_the_run() -> None:
    steps = 0
    seen: set[tuple[int, int]] = set()

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        nonlocal steps
        steps += 1
        grad[:] = 1.0
        return 1.0

    def stop_when(live: int, joined: int) -> bool:
        seen.add((live, joined))
        return steps >= 5

    report, worker = run(compute, stop_when)
    assert report["reason"] == "stopped" and report["updates"] >= 4, report
    assert worker["stopped"], worker
    assert (1, 1) in seen, seen


def test_an_exception_in_stop_when_stops_the_run_and_is_raised() -> None:
    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        grad[:] = 1.0
        return 1.0

    def stop_when(live: int, joined: int) -> bool:
        if joined:
            raise KeyError("stop_when broke")
        return False

    with pytest.raises(KeyError, match="stop_when broke"):
        run(compute, stop_when)


def test_with_optional_loss_a_gradient_travels_without_a_loss() -> None:
    steps = 0

    def compute(params: np.ndarray, grad: np.ndarray) -> Optional[float]:
        nonlocal steps
        steps += 1
        grad[:] = 0.5
        return 2.0 if steps % 2 == 0 else None

    report, worker = run(compute, lambda live, joined: steps >= 8, optional_loss=True)
    assert not isinstance(worker, Exception), worker
    losses = [loss for _, _, loss in report["losses"]]
    # Only the updates of the steps that reported a loss are on the loss curve.
    assert losses and all(loss == 2.0 for loss in losses), losses
    assert len(losses) < report["updates"], (len(losses), report["updates"])
