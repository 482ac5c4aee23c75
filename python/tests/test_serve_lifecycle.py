"""How `syncopate.serve` ends when nothing progresses: Ctrl-C, workers that never come or are
all lost, the time limit; and what `evaluate` may touch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest

import syncopate

from test_serve import DIM, Cluster, least_squares, serve, slowly

# A server in a child process, so the test can send it SIGINT. It prints its address, then
# the report's reason and whether the model was kept, one per line.
SERVER = textwrap.dedent(
    """
    import sys, threading, numpy as np, syncopate
    workers, connecting = int(sys.argv[1]), int(sys.argv[2])
    params = np.full(8, 0.5, dtype=np.float32)
    lines = []

    def start(address):
        print(address, flush=True)
        for i in range(connecting):
            def run(i=i):
                def compute(p, g):
                    g[:] = 0.0
                    return 1.0
                syncopate.run_worker(address, compute, id=i, log=lambda _: None)
            threading.Thread(target=run, daemon=True).start()

    protocol = syncopate.Protocol("bsp", workers=workers, lr=0.1, stall_report_ms=100)
    report = syncopate.serve(params, protocol, updates=10**9, on_listen=start, log=lines.append)
    print(report["reason"], flush=True)
    print("kept" if params.shape == (8,) and np.isfinite(params).all() else "lost", flush=True)
    print("|".join(lines), flush=True)
    """
)


def interrupted_server(workers: int, connecting: int, wait_for: str) -> list[str]:
    """Starts SERVER, waits until its log (stderr is quiet: the log goes to a list) would
    have said `wait_for`, sends SIGINT, and returns its stdout lines."""
    child = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(workers), str(connecting)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert child.stdout is not None
        address = child.stdout.readline().strip()
        assert ":" in address, (address, child.stderr.read() if child.stderr else "")
        # Long enough for the workers to connect and the reports to be due.
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    lines = out.splitlines()
    assert wait_for in lines[-1], lines
    return lines


@pytest.mark.skipif(os.name != "posix", reason="SIGINT to a child process")
def test_ctrl_c_stops_a_server_waiting_for_its_first_workers_and_keeps_the_report() -> None:
    lines = interrupted_server(2, 0, "waiting for workers 0, 1 to connect (0 of 2 connected)")
    assert lines[:2] == ["interrupted", "kept"], lines
    assert "interrupted: the workers are told to stop" in lines[-1], lines


@pytest.mark.skipif(os.name != "posix", reason="SIGINT to a child process")
def test_ctrl_c_stops_a_stalled_round_and_the_connected_worker_is_told_to_stop() -> None:
    # Worker 0 connects, worker 1 never does: no model update ever comes.
    lines = interrupted_server(2, 1, "waiting for workers 1 to connect (1 of 2 connected)")
    assert lines[:2] == ["interrupted", "kept"], lines


def test_a_server_whose_every_worker_was_lost_stops_after_lost_after() -> None:
    protocol = syncopate.Protocol("asp", workers=1, lr=0.1)
    params = np.zeros(DIM, dtype=np.float32)
    good = least_squares(11)
    steps = 0

    def fails_after_3(p: np.ndarray, g: np.ndarray) -> float:
        nonlocal steps
        steps += 1
        if steps > 3:
            raise RuntimeError("out of data")
        return good(p, g)

    cluster = Cluster([fails_after_3])
    lines: list[str] = []
    began = time.monotonic()
    report = syncopate.serve(params, protocol, updates=10**9, on_listen=cluster.start, log=lines.append)
    took = time.monotonic() - began
    cluster.join()
    assert isinstance(cluster.results[0], syncopate.WorkerError)
    assert report["reason"] == "all_workers_lost", report["reason"]
    assert report["lost_workers"] == [0]
    assert "every worker has been lost (workers 0); stopping in 10.0 s unless one rejoins" in lines, lines
    assert lines[-1] == "no worker rejoined within 10.0 s: stopping (wait_for_rejoin=True waits)", lines
    assert 10.0 <= took < 30.0, took


def test_wait_for_rejoin_keeps_a_server_without_workers_until_one_comes_back() -> None:
    protocol = syncopate.Protocol("asp", workers=1, lr=0.1)
    params = np.zeros(DIM, dtype=np.float32)

    def broken(p: np.ndarray, g: np.ndarray) -> float:
        raise KeyError("no batch")

    lines: list[str] = []
    rejoined: dict[str, Any] = {}

    def log(line: str) -> None:
        lines.append(line)
        if "waiting for them to rejoin" in line:
            # The same worker id comes back (a restarted process) and finishes the run.
            def rejoin() -> None:
                rejoined["report"] = syncopate.run_worker(address, slowly(least_squares(12)), id=0,
                                                          log=lambda _: None)
            threading.Thread(target=rejoin, daemon=True).start()

    cluster = Cluster([broken])
    address = ""

    def on_listen(a: str) -> None:
        nonlocal address
        address = a
        cluster.start(a)

    report = syncopate.serve(params, protocol, updates=50, on_listen=on_listen, log=log, wait_for_rejoin=True)
    cluster.join()
    assert report["reason"] == "updates", (report["reason"], lines)
    assert "every worker has been lost (workers 0); waiting for them to rejoin" in lines, lines


def test_the_time_limit_leaves_evaluations_out() -> None:
    protocol = syncopate.Protocol("bsp", workers=1, lr=0.05)
    params = np.zeros(DIM, dtype=np.float32)
    cluster = Cluster([slowly(least_squares(13))])

    def slow_evaluate(model: np.ndarray) -> float:
        time.sleep(0.1)
        return 0.0

    report = serve(protocol, cluster, params, evaluate=slow_evaluate, every=2, time_limit_s=0.6)
    assert report["reason"] == "time_limit"
    # Evaluations took some of the wall time; the training time still reached the limit.
    assert report["eval_s"] >= 0.1, report["eval_s"]
    assert 0.55 <= report["wall_s"] < 3.0, report["wall_s"]


def test_evaluate_gets_a_read_only_view_of_the_live_model() -> None:
    protocol = syncopate.Protocol("bsp", workers=1, lr=0.1)
    params = np.zeros(DIM, dtype=np.float32)
    cluster = Cluster([least_squares(14)])
    seen: list[bool] = []

    def evaluate(model: np.ndarray) -> float:
        assert model is not params and np.shares_memory(model, params)
        assert model.shape == params.shape and model.dtype == np.float32
        assert not model.flags.writeable
        with pytest.raises(ValueError):
            model.flags.writeable = True
        seen.append(True)
        return float(model[0])

    serve(protocol, cluster, params, evaluate=evaluate, every=5, updates=20)
    assert len(seen) == 4

    def writes(model: np.ndarray) -> float:
        model[0] = 1.0
        return 0.0

    cluster = Cluster([least_squares(15)])
    with pytest.raises(ValueError, match="read-only"):
        serve(protocol, cluster, params, evaluate=writes, every=5, updates=20)


def test_protocol_takes_its_worker_count_from_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in syncopate.WORLD_SIZE_VARIABLES + syncopate.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"no worker count: pass workers= .*\$WORLD_SIZE"):
        syncopate.Protocol("bsp")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert syncopate.Protocol("bsp").workers == 3
    assert syncopate.Protocol("bsp", workers=5).workers == 5
    monkeypatch.setenv("WORLD_SIZE", "0")
    with pytest.raises(ValueError, match=r"\$WORLD_SIZE is 0"):
        syncopate.Protocol("bsp")


def test_the_rank_never_comes_from_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in syncopate.WORLD_SIZE_VARIABLES + syncopate.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert "LOCAL_RANK" not in syncopate.RANK_VARIABLES
    with pytest.raises(ValueError, match="no worker id"):
        syncopate.worker_id_from_env()
    monkeypatch.setenv("PMI_RANK", "2")
    assert syncopate.worker_id_from_env() == 2
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(ValueError, match=r"\$PMI_RANK is 2 but \$PMI_SIZE is 2"):
        syncopate.worker_id_from_env()


def test_a_worker_under_a_launcher_of_another_size_is_refused_and_master_addr_is_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in syncopate.WORLD_SIZE_VARIABLES + syncopate.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    protocol = syncopate.Protocol("bsp", workers=2, lr=0.1, stall_report_ms=50)
    params = np.zeros(DIM, dtype=np.float32)
    results: dict[str, Any] = {}

    class Done(Exception):
        pass

    def start(address: str) -> None:
        host, port = address.rsplit(":", 1)
        monkeypatch.setenv("MASTER_ADDR", host)
        monkeypatch.setenv("MASTER_PORT", port)
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "3")

        def run() -> None:
            try:
                results["worker"] = syncopate.run_worker(None, least_squares(16), log=lambda _: None)
            except Exception as e:  # noqa: BLE001 - the test inspects it
                results["worker"] = e

        threading.Thread(target=run, daemon=True).start()

    def log(line: str) -> None:
        # The run never starts (worker 1 is refused, worker 0 never comes): a raising log
        # ends the server once the worker has ended.
        if "worker" in results:
            raise Done(line)

    with pytest.raises(Done):
        syncopate.serve(params, protocol, updates=10, on_listen=start, log=log)
    error = results["worker"]
    assert isinstance(error, syncopate.WorkerError), error
    assert "$WORLD_SIZE is 3 but the run has 2 workers" in str(error), error
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(ValueError, match=r"no server address: pass connect= .*\$MASTER_ADDR and \$MASTER_PORT"):
        syncopate.run_worker(None, least_squares(16))


def test_updates_before_the_last_worker_connects_are_not_on_the_run_s_clock() -> None:
    """ASP trains with worker 0 alone while worker 1 is late: those updates have no time on
    the run's clock (it starts once both have connected), so they are not in the loss curve
    rather than on it at 0.0 s."""
    protocol = syncopate.Protocol("asp", workers=2, lr=0.05)
    params = np.zeros(DIM, dtype=np.float32)
    results: dict[int, Any] = {}
    threads: list[threading.Thread] = []

    def run(address: str, i: int) -> None:
        results[i] = syncopate.run_worker(address, slowly(least_squares(17 + i)), id=i, log=lambda _: None)

    def start(address: str) -> None:
        threads.append(threading.Thread(target=run, args=(address, 0), daemon=True))
        late = threading.Timer(0.5, run, args=(address, 1))
        late.daemon = True
        threads.append(late)
        for t in threads:
            t.start()

    report = syncopate.serve(params, protocol, updates=400, on_listen=start, log=lambda _: None)
    for t in threads:
        t.join(timeout=30)
    assert results[0]["stopped"] and results[1]["stopped"], results
    assert report["connect_wait_s"] >= 0.5, report["connect_wait_s"]
    losses = report["losses"]
    assert losses and all(t > 0.0 for _, t, _ in losses), losses[:3]
    # Worker 0 made updates alone before worker 1 came: they are not on the curve.
    assert losses[0][0] > 10, losses[0]
