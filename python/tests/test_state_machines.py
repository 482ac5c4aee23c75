"""The state machines over NumPy arrays, driven in process as a transport would."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import syncopate


def drain_workers(
    server: syncopate.Server,
    workers: list[syncopate.Worker],
    targets: np.ndarray,
    now: int,
    pending: dict,
    events: list[dict],
) -> None:
    """Sends what each worker has, draining the server after every message (the driving
    contract); a gradient asked for is computed now and handed in on the next tick (so a
    worker that keeps computing, like optimized WBSP, yields each tick)."""
    for i, w in enumerate(workers):
        if i in pending:
            job, grad = pending.pop(i)
            try:
                w.handle_gradient(now, job, grad)
            except syncopate.RejectedError:
                pass  # a newer model arrived meanwhile: the job was abandoned (the worker asks again)
        while (out := w.poll_output()) is not None:
            if out[0] == "send":
                server.handle(now, i, out[1])
                events += drain_server(server, workers, now)
            elif out[0] == "compute":
                _, job, _version, params = out
                assert params is w_params[i] or params.shape == w_params[i].shape
                pending[i] = (job, (params - targets[i]).astype(np.float32))


def drain_server(server: syncopate.Server, workers: list[syncopate.Worker], now: int) -> list[dict]:
    events = []
    while (out := server.poll_output()) is not None:
        if out[0] == "send":
            _, to, message = out
            for i, w in enumerate(workers):
                if to is None or to == i:
                    w.handle(now, message)
        else:
            events.append(out[1])
    return events


w_params: list[np.ndarray] = []


def test_the_stub_lists_every_protocol() -> None:
    # The stub's `ProtocolName` is the native list (the core's `ProtocolKind::ALL`).
    stub = ast.parse((Path(syncopate.__file__).parent / "_native.pyi").read_text())
    alias = next(n for n in stub.body if isinstance(n, ast.Assign) and n.targets[0].id == "ProtocolName")
    names = tuple(e.value for e in alias.value.slice.elts)
    assert names == syncopate.PROTOCOLS
    for name in syncopate.PROTOCOLS:
        assert syncopate.Protocol(name, workers=2).name == name
    with pytest.raises(ValueError, match="expected one of bsp, asp"):
        syncopate.Protocol("nope")


@pytest.mark.parametrize("name", syncopate.PROTOCOLS)
def test_every_protocol_trains_in_place(name: str) -> None:
    n, dim = 2, 5
    # Only the knobs that apply: like the command line, Protocol refuses the others.
    knobs = {"ssp": {"staleness": 2}, "bap": {"staleness": 2}, "grouped": {"groups": 1}}.get(name, {})
    protocol = syncopate.Protocol(name, workers=n, lr=0.4, **knobs)
    model = np.zeros(dim, dtype=np.float32)
    server = syncopate.Server(protocol, model)
    w_params.clear()
    w_params.extend(np.zeros(dim, dtype=np.float32) for _ in range(n))
    workers = [syncopate.Worker(protocol, i, w_params[i]) for i in range(n)]
    targets = np.stack([np.arange(dim, dtype=np.float32) + (0.01 if i % 2 else -0.01) for i in range(n)])
    events: list[dict] = []
    pending: dict = {}
    for tick in range(3000):
        now = tick * 1_000_000
        drain_workers(server, workers, targets, now, pending, events)
        events += drain_server(server, workers, now)
        if server.version >= 300:
            server.stop()
            drain_server(server, workers, now)
            break
    assert server.version >= 300, f"{name}: stuck at version {server.version}"
    assert server.params is model, "the server must update the caller's array in place"
    np.testing.assert_allclose(model, np.arange(dim), atol=0.05)
    assert all(w.is_stopped for w in workers)
    assert any(e["kind"] == "worker_joined" for e in events)
    stats = server.stats()
    assert stats["applied"] >= 300 and stats["rejected"] == 0


def test_bad_inputs_raise_clear_errors() -> None:
    protocol = syncopate.Protocol("bsp", workers=1, lr=0.5)
    with pytest.raises(ValueError, match="float32"):
        syncopate.Server(protocol, np.zeros(4, dtype=np.float64))
    with pytest.raises(ValueError, match="writable"):
        frozen = np.zeros(4, dtype=np.float32)
        frozen.flags.writeable = False
        syncopate.Server(protocol, frozen)
    with pytest.raises(ValueError, match="unknown protocol 'nope'"):
        syncopate.Protocol("nope")
    model = np.zeros(4, dtype=np.float32)
    server = syncopate.Server(protocol, model)
    with pytest.raises(ValueError, match="malformed message"):
        server.handle(0, 0, b"garbage")
    worker_params = np.zeros(4, dtype=np.float32)
    worker = syncopate.Worker(protocol, 0, worker_params)
    out = worker.poll_output()
    assert out is not None and out[0] == "send"
    server.handle(0, 0, out[1])
    while (o := server.poll_output()) is not None:
        if o[0] == "send":
            worker.handle(0, o[2])
    compute = [o for o in iter(worker.poll_output, None) if o[0] == "compute"]
    assert len(compute) == 1
    assert compute[0][3] is worker_params, "compute hands out the worker's own array, not a copy"
    with pytest.raises(ValueError, match="3 elements, expected 4"):
        worker.handle_gradient(0, compute[0][1], np.zeros(3, dtype=np.float32))
    with pytest.raises(syncopate.RejectedError, match="not requested"):
        worker.handle_gradient(0, 999, np.zeros(4, dtype=np.float32))
    # A rejected gradient changed nothing: the real job still completes.
    worker.handle_gradient(0, compute[0][1], np.ones(4, dtype=np.float32))
    sent = worker.poll_output()
    assert sent is not None and sent[0] == "send"
    server.handle(0, 0, sent[1])
    assert server.version == 1
    np.testing.assert_allclose(model, -0.5 * np.ones(4))


def test_a_gradient_sharing_memory_with_the_workers_arrays_is_refused() -> None:
    protocol = syncopate.Protocol("bsp", workers=1, lr=0.5)
    server = syncopate.Server(protocol, np.zeros(4, dtype=np.float32))
    backing = np.zeros(8, dtype=np.float32)
    worker_params = backing[2:6]
    worker = syncopate.Worker(protocol, 0, worker_params)
    server.handle(0, 0, worker.poll_output()[1])
    while (o := server.poll_output()) is not None:
        if o[0] == "send":
            worker.handle(0, o[2])
    job = next(o for o in iter(worker.poll_output, None) if o[0] == "compute")[1]
    # The params themselves, a view starting before them and one starting inside them, and a
    # strided view reaching into them: each shares bytes with memory the worker writes.
    for grad in (worker_params, backing[0:4], backing[4:8], backing[::2]):
        with pytest.raises(ValueError, match="overlaps the worker's params or scratch"):
            worker.handle_gradient(0, job, grad)
    worker.handle_gradient(0, job, np.ones(4, dtype=np.float32))
    assert worker.stats() == {"outputs_lost": 0}
    assert server.stats()["outputs_lost"] == 0
