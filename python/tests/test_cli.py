"""The `syncopate` console script the wheel installs: `serve` over the extension, every other
command handed to the Rust CLI when one is installed, else refused naming what to install."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import sysconfig
import threading
import time

import numpy as np
import pytest

import syncopate


def installed_script() -> pathlib.Path:
    """The `syncopate` command this installation of the package put on disk: beside the
    package (`pip install --target DIR` puts it in DIR/bin), where the wheel's RECORD says,
    or in the environment's scripts folder."""
    try:
        dist = importlib.metadata.distribution("syncopate")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("syncopate is not installed from a wheel (no package metadata)")
    declared = [e for e in dist.entry_points if e.group == "console_scripts" and e.name == "syncopate"]
    assert declared, "the wheel declares no `syncopate` console script"
    assert declared[0].value == "syncopate.cli:main"
    recorded = [f for f in dist.files or [] if f.name == "syncopate" and f.parent.name == "bin"]
    assert recorded, "the wheel's RECORD lists no bin/syncopate"
    candidates = [
        pathlib.Path(syncopate.__file__).resolve().parents[1] / "bin" / "syncopate",
        pathlib.Path(dist.locate_file(recorded[0])),
        pathlib.Path(sysconfig.get_path("scripts")) / "syncopate",
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK) and "syncopate.cli" in path.read_text(errors="replace"):
            return path
    raise AssertionError(f"no installed `syncopate` command among {[str(c) for c in candidates]}")


SCRIPT = None


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """Runs the installed command with the Python subset forced (`SYNCOPATE_CLI` empty)."""
    global SCRIPT
    SCRIPT = SCRIPT or installed_script()
    full = {**os.environ, "SYNCOPATE_CLI": "", **(env or {})}
    return subprocess.run([str(SCRIPT), *args], env=full, capture_output=True, text=True, timeout=timeout, **kw)


def one_error_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def test_help_names_what_runs_here_and_the_rust_cli():
    p = cli("--help")
    assert p.returncode == 0, p.stderr
    assert "serve --init FILE.npy" in p.stdout and "cargo install --path adapters/cli" in p.stdout
    assert cli().returncode == 2


def test_python_m_syncopate_is_the_same_command(tmp_path):
    # Run elsewhere than python/, whose source folder `-m` would import instead of the wheel.
    env = {**os.environ, "SYNCOPATE_CLI": ""}
    p = subprocess.run([sys.executable, "-m", "syncopate", "work"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert p.returncode == 2 and "cargo install --path adapters/cli" in one_error_line(p)


@pytest.mark.parametrize("command", ["work --connect 127.0.0.1:7070 --id 0", "train", "compare", "advise"])
def test_commands_of_the_rust_cli_exit_2_naming_the_install(command):
    p = cli(*command.split())
    assert p.returncode == 2
    line = one_error_line(p)
    assert f"syncopate {command.split()[0]}" in line and "cargo install --path adapters/cli" in line


def test_unknown_command_is_usage():
    p = cli("frobnicate")
    assert p.returncode == 2 and "unknown command 'frobnicate'" in one_error_line(p)


@pytest.mark.parametrize(
    "args, says",
    [
        (["serve"], "serve without --init"),
        (["serve", "--init-from-worker", "--dim", "5"], "serve --init-from-worker needs the Rust CLI"),
        (["serve", "--init", "x.npy", "--checkpoint", "c"], "serve --checkpoint needs the Rust CLI"),
        (["serve", "--init", "x.npy", "--model=mlp"], "serve --model needs the Rust CLI"),
        (["serve", "--protocol", "foo", "--init", "x.npy"], "invalid choice: 'foo'"),
        (["serve", "--workers", "0", "--init", "x.npy"], "0 is not in 1..=65535"),
        (["serve", "--momentum", "1", "--init", "x.npy"], "momentum must be a number in [0, 1)"),
        (["serve", "--steps", "-3", "--init", "x.npy"], "--steps must be a positive number"),
        (["serve", "--bogus"], "unrecognized arguments: --bogus"),
        (["serve", "--init", "x.npy", "--weight-decay", "0.1"], "--weight-decay applies to rule 'adamw' only"),
        (["serve", "--init", "x.npy", "--optimizer", "adamw", "--momentum", "0.5"], "--momentum applies to rules"),
        (["serve", "--init", "x.npy", "--optimizer", "lamb"], "--optimizer 'lamb': expected one of"),
        (["serve", "--init", "x.npy", "--optimizer", "adamw", "--beta2", "1"], "--beta2 must be a number in [0, 1)"),
        (["serve", "--init", "x.npy", "--schedule", "cosine"], "--schedule "),
        (["serve", "--init", "x.npy", "--wire", "f16"], "invalid choice: 'f16'"),
    ],
)
def test_serve_usage_errors_exit_2_on_one_line(args, says):
    p = cli(*args)
    assert p.returncode == 2, p.stderr
    assert says in one_error_line(p)


def test_serve_refuses_a_bad_initial_vector_naming_the_file_and_why(tmp_path):
    cases = {
        "missing.npy": (None, "cannot read"),
        "f64.npy": (np.zeros(4), "dtype <f8: expected '<f4'"),
        "two_d.npy": (np.zeros((2, 2), np.float32), "shape (2, 2): expected one dimension"),
        "empty.npy": (np.zeros(0, np.float32), "the vector is empty"),
        "nan.npy": (np.array([0, 1, np.nan], np.float32), "element 2 is nan"),
    }
    for name, (array, says) in cases.items():
        path = tmp_path / name
        if array is not None:
            np.save(path, array)
        p = cli("serve", "--init", str(path), "--workers", "1", "--listen", "127.0.0.1:0")
        assert p.returncode == 2, (name, p.stderr)
        line = one_error_line(p)
        assert str(path) in line and says in line, line
    # A protocol setting the core refuses is a usage error too.
    np.save(tmp_path / "ok.npy", np.zeros(3, np.float32))
    p = cli("serve", "--init", str(tmp_path / "ok.npy"), "--workers", "2", "--protocol", "backup",
            "--backup-workers", "2", "--listen", "127.0.0.1:0")
    assert p.returncode == 2 and "protocol backup" in one_error_line(p)


def start_serve(tmp_path, *args: str) -> tuple[subprocess.Popen, str]:
    """Starts `syncopate serve` on a free port; returns it and the address it listens on."""
    global SCRIPT
    SCRIPT = SCRIPT or installed_script()
    proc = subprocess.Popen([str(SCRIPT), "serve", "--listen", "127.0.0.1:0", *args],
                            env={**os.environ, "SYNCOPATE_CLI": ""}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = re.search(r"listening on (\S+)", line)
    assert found, line + proc.stderr.read()
    # Keep reading standard error so the server never blocks on a full pipe.
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, found.group(1)


def quadratic_worker(address: str, id: int, target: np.ndarray) -> dict:
    def compute(params, grad):
        np.subtract(params, target, out=grad)
        return float(0.5 * np.dot(grad, grad))

    return syncopate.run_worker(address, compute, id=id, log=lambda _: None, give_up_after_s=10.0)


def vector_files(tmp_path, n):
    """`n` elements of 4.0 saved as init.npy, the path final.npy, the start and a target in [-1, 1]."""
    init, final = tmp_path / "init.npy", tmp_path / "final.npy"
    start = np.full(n, 4.0, np.float32)
    np.save(init, start)
    return init, final, start, np.linspace(-1, 1, n).astype(np.float32)


def test_serve_trains_a_vector_of_your_own_with_two_python_workers(tmp_path):
    init, final, start, target = vector_files(tmp_path, 16)
    proc, address = start_serve(tmp_path, "--init", str(init), "--workers", "2", "--lr", "0.2", "--steps", "60",
                                "--save", str(final), "--target-loss", "0.5", "--json")
    workers = [threading.Thread(target=quadratic_worker, args=(address, i, target)) for i in range(2)]
    for w in workers:
        w.start()
    out, _ = proc.communicate(timeout=60)
    for w in workers:
        w.join(timeout=30)
    assert proc.returncode == 0
    report = json.loads(out)
    assert report["protocol"] == "bsp" and report["workers"] == 2 and report["dim"] == 16
    assert report["gradients"]["accepted"] == 120 and report["updates"] == 60
    trained = np.load(final)
    assert trained.dtype == np.float32 and trained.shape == (16,)
    # SGD at 0.2 on 0.5 |x - t|^2 shrinks the distance by 0.8 per update.
    assert np.abs(trained - target).max() < 1e-3 * np.abs(start - target).max()
    curve = report["loss_curve"]
    assert curve["window"] == 10 and len(curve["points"]) == 60
    assert curve["time_to_target_loss_s"] is not None and curve["version_at_target_loss"] >= 10
    means = [np.mean([p["loss"] for p in curve["points"][i - 9 : i + 1]]) for i in range(9, 60)]
    first = next(i for i, m in enumerate(means) if m <= 0.5)
    assert curve["version_at_target_loss"] == curve["points"][first + 9]["version"]


def test_serve_wire_bf16_trains_a_float32_vector(tmp_path):
    init, final = tmp_path / "init.npy", tmp_path / "final.npy"
    start = np.full(16, 4.0, np.float32)
    target = np.linspace(-1, 1, 16).astype(np.float32)
    np.save(init, start)
    proc, address = start_serve(tmp_path, "--init", str(init), "--workers", "2", "--lr", "0.2", "--steps", "60",
                                "--save", str(final), "--wire", "bf16", "--json")
    workers = [threading.Thread(target=quadratic_worker, args=(address, i, target)) for i in range(2)]
    for w in workers:
        w.start()
    out, _ = proc.communicate(timeout=60)
    for w in workers:
        w.join(timeout=30)
    assert proc.returncode == 0
    assert json.loads(out)["updates"] == 60
    trained = np.load(final)
    assert trained.dtype == np.float32
    assert np.abs(trained - target).max() < 1e-2 * np.abs(start - target).max()


def test_serve_stops_cleanly_on_sigterm_and_still_saves(tmp_path):
    init, final = tmp_path / "init.npy", tmp_path / "final.npy"
    np.save(init, np.ones(8, np.float32))
    proc, _ = start_serve(tmp_path, "--init", str(init), "--workers", "2", "--save", str(final))
    time.sleep(0.5)  # nobody connects: the server waits
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "stopped        interrupted" in out
    assert np.array_equal(np.load(final), np.ones(8, np.float32))


def test_every_command_goes_to_the_rust_cli_when_one_is_installed(tmp_path, syncopate_bin):
    expected = subprocess.run([str(syncopate_bin), "--version"], capture_output=True, text=True).stdout
    assert expected.strip()
    # Named by $SYNCOPATE_CLI.
    p = cli("--version", env={"SYNCOPATE_CLI": str(syncopate_bin)})
    assert p.returncode == 0 and p.stdout == expected
    # Found on the PATH: the first `syncopate` that is a program, not a script (another
    # environment's console script, first on the PATH, is passed over).
    scripts, programs = tmp_path / "scripts", tmp_path / "programs"
    scripts.mkdir()
    programs.mkdir()
    shim = scripts / "syncopate"
    shim.write_text(f"#!{sys.executable}\nraise SystemExit(99)\n")
    shim.chmod(0o755)
    (programs / "syncopate").symlink_to(syncopate_bin)
    env = dict(os.environ)
    env.pop("SYNCOPATE_CLI", None)
    env["PATH"] = os.pathsep.join([str(scripts), str(programs), env.get("PATH", "")])
    global SCRIPT
    SCRIPT = SCRIPT or installed_script()
    p = subprocess.run([str(SCRIPT), "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == expected
    # $SYNCOPATE_CLI naming a script (this command itself) is refused, never a loop.
    p = cli("--version", env={"SYNCOPATE_CLI": str(SCRIPT)})
    assert p.returncode == 2 and "is a script, not the Rust CLI" in one_error_line(p)
    # The Rust CLI's own usage errors and exit codes.
    p = subprocess.run([str(SCRIPT), "serve", "--workers", "0"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "0 is not in 1..=65535" in p.stderr


def test_serve_runs_the_update_rule_its_flags_name(tmp_path):
    # One AdamW step moves every coordinate by the learning rate against the gradient's sign
    # (m / sqrt(v) = sign(g) at the first step), where SGD would move it by lr x gradient.
    init, final, start, target = vector_files(tmp_path, 8)
    proc, address = start_serve(tmp_path, "--init", str(init), "--workers", "1", "--lr", "0.25", "--steps", "1",
                                "--optimizer", "adamw", "--weight-decay", "0", "--save", str(final))
    worker = threading.Thread(target=quadratic_worker, args=(address, 0, target))
    worker.start()
    out, _ = proc.communicate(timeout=60)
    worker.join(timeout=30)
    assert proc.returncode == 0, out
    np.testing.assert_allclose(np.load(final), start - 0.25, rtol=0, atol=1e-6)
