"""`serve(wire=)` and `run_worker(wire=)`: gradients and models in bf16 or fp16 on the wire,
the live array staying float32; a worker insisting on another encoding is refused at the
handshake naming both; an unknown encoding is a ValueError."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import pytest

import syncopate

DIM = 8
TRUE_W = np.arange(1, DIM + 1, dtype=np.float32) / DIM


def least_squares(seed: int) -> Callable[[np.ndarray, np.ndarray], float]:
    """Minibatch gradient of 0.5 * mean((x @ w - y)^2), returning the loss."""
    rng = np.random.default_rng(seed)

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        x = rng.standard_normal((16, DIM)).astype(np.float32)
        r = x @ params - x @ TRUE_W
        grad[:] = x.T @ r / len(r)
        return float(0.5 * np.mean(r * r))

    return compute


def run(server_wire: str, worker_wire: str | None, **serve_options: Any) -> tuple[np.ndarray, dict[str, Any], Any, list[str]]:
    """One worker in a thread against `serve` here; the model, the report, the worker's
    result (or its exception) and the server's log."""
    serve_options.setdefault("updates", 300)
    params = np.zeros(DIM, dtype=np.float32)
    result: dict[str, Any] = {}
    threads: list[threading.Thread] = []

    def work(address: str) -> None:
        try:
            result["r"] = syncopate.run_worker(address, least_squares(3), id=0, log=lambda _: None, wire=worker_wire)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            result["r"] = e

    def start(address: str) -> None:
        t = threading.Thread(target=work, args=(address,), daemon=True)
        t.start()
        threads.append(t)

    lines: list[str] = []
    report = syncopate.serve(params, syncopate.Protocol("bsp", workers=1, lr=0.2), on_listen=start,
                             log=lines.append, wire=server_wire, **serve_options)
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    return params, report, result.get("r"), lines


@pytest.mark.parametrize("wire, asked", [("bf16", None), ("bf16", "bf16"), ("fp16", "fp16")])
def test_training_in_16_bits_keeps_a_float32_model_that_learns(wire: str, asked: str | None) -> None:
    params, report, worker, _ = run(wire, asked)
    assert isinstance(worker, dict), worker
    assert report["reason"] == "updates"
    assert params.dtype == np.float32
    assert np.linalg.norm(params - TRUE_W) < 0.05
    # The rounding on the wire shows: the same run in f32 ends elsewhere.
    plain, _, _, _ = run("f32", None)
    assert not np.array_equal(params, plain)


def test_a_worker_asking_for_another_encoding_is_refused_naming_both() -> None:
    _, report, worker, lines = run("f32", "bf16", time_limit_s=3.0)
    assert isinstance(worker, syncopate.WorkerError), worker
    assert "worker asks for bf16, server speaks f32" in str(worker)
    assert any("worker asks for bf16, server speaks f32 (worker 0)" in line for line in lines), lines
    assert report["updates"] == 0


def test_an_unknown_encoding_is_a_value_error() -> None:
    with pytest.raises(ValueError, match='"f16" is not a wire encoding'):
        syncopate.serve(np.zeros(DIM, dtype=np.float32), syncopate.Protocol("bsp", workers=1), updates=1, wire="f16")
    with pytest.raises(ValueError, match='"int8" is not a wire encoding'):
        syncopate.run_worker("127.0.0.1:1", least_squares(1), id=0, wire="int8")
