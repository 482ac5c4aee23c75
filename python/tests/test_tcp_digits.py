"""`syncopate serve` (with a shared secret) and Python worker processes over loopback."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import time

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "numpy_logistic_worker.py"


def start_server(syncopate_bin: pathlib.Path, secret: pathlib.Path, *flags: str) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [str(syncopate_bin), "serve", "--listen", "127.0.0.1:0", "--secret-file", str(secret), "--json", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = server.stderr.readline()
        if m := re.search(r"listening on (\S+?),", line):
            return server, m.group(1)
        if not line and server.poll() is not None:
            break
    server.kill()
    pytest.fail(f"syncopate serve did not start: {server.stderr.read()}")


def worker(addr: str, id: int, secret: pathlib.Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--connect", addr, "--id", str(id), "--secret-file", str(secret), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def secret(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "secret"
    path.write_text("correct horse battery staple, but longer than that\n")
    path.chmod(0o600)
    return path


def test_two_python_workers_train_digits_over_tcp(syncopate_bin: pathlib.Path, secret: pathlib.Path) -> None:
    server, addr = start_server(syncopate_bin, secret, "--workers", "2", "--steps", "300")
    workers = [worker(addr, i, secret) for i in range(2)]
    for w in workers:
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
        assert "'stopped': True" in out
    out, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    summary = json.loads(out)
    assert summary["updates"] == 300
    assert summary["final_accuracy"] >= 0.90, summary["final_accuracy"]


def test_an_exception_in_the_callback_ends_that_worker_and_the_server_loses_it(
    syncopate_bin: pathlib.Path, secret: pathlib.Path
) -> None:
    # ASP: the failing worker trains alone until its callback raises; then a healthy worker
    # finishes the run, and the server must have counted worker 0 as lost.
    server, addr = start_server(syncopate_bin, secret, "--workers", "2", "--steps", "100", "--protocol", "asp")
    failing = worker(addr, 0, secret, "--fail-after", "5")
    out, err = failing.communicate(timeout=120)
    assert failing.returncode == 1
    assert "worker 0: compute raised RuntimeError: planted failure after 5 gradients" in err
    assert "planted failure after 5 gradients" in err
    healthy = worker(addr, 1, secret)
    healthy.communicate(timeout=300)
    out, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    assert "serve: worker 0 lost" in err, err
    summary = json.loads(out)
    assert summary["gradients"]["refused"] <= 1
