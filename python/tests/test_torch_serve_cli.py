"""`syncopate serve --init-from-worker --save out.npy` (the CLI binary) trains a small PyTorch
CNN with two PyTorch worker processes on MNIST 5k: worker 0 sends the initial model, the
server saves the final one, and this test loads it into the model and measures its test
accuracy (at least 0.90).

torch is required (see torch_required.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from torch_required import require_torch

torch = require_torch()

import syncopate
import syncopate.torch as st

# The model every process builds (the same seed: worker 0's copy is the server's initial model).
MODEL = """
import torch
def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(256, 10),
    )
"""

WORKER = (
    MODEL
    + """
import sys
import syncopate, syncopate.torch as st
torch.set_num_threads(1)
data = syncopate.load_mnist5k()
x, y = torch.from_numpy(data["x_train"]).view(-1, 1, 28, 28), torch.from_numpy(data["y_train"])
# Each worker its own minibatches (make_model() resets the global seed before they are drawn).
shuffle = torch.Generator().manual_seed(int(sys.argv[2]))
batches = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True,
                                      generator=shuffle)
report = st.train_worker(make_model(), torch.nn.functional.cross_entropy, batches, connect=sys.argv[1],
                         id=int(sys.argv[2]), log=lambda line: None)
assert report["stopped"], report
"""
)


def make_model() -> torch.nn.Module:
    scope: dict = {}
    exec(MODEL, scope)
    return scope["make_model"]()


def start_server(binary: pathlib.Path, args: list[str]) -> tuple[subprocess.Popen, str, list[str]]:
    """Starts `syncopate serve` on a free port; returns it, its address and its log lines (filled
    by a thread)."""
    server = subprocess.Popen(
        [str(binary), "serve", "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    found = threading.Event()
    address: list[str] = []

    def read() -> None:
        assert server.stderr is not None
        for line in server.stderr:
            lines.append(line.rstrip("\n"))
            m = re.search(r"listening on (\S+?)[,\s]", line)
            if m and not address:
                address.append(m.group(1))
                found.set()
        found.set()

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(30), lines
    assert address, "\n".join(lines)
    return server, address[0], lines


def test_serve_init_from_worker_trains_a_torch_cnn_to_090_and_saves_it(syncopate_bin, tmp_path) -> None:
    model = make_model()
    dim = sum(p.numel() for p in model.parameters())
    saved = tmp_path / "out.npy"
    server, address, lines = start_server(
        syncopate_bin,
        ["--protocol", "bsp", "--workers", "2", "--lr", "0.1", "--steps", "500", "--init-from-worker",
         "--dim", str(dim), "--save", str(saved), "--target-loss", "0.5", "--time-limit", "240", "--json"],
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # Run from elsewhere than python/, whose syncopate/ source folder would shadow the wheel.
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, address, str(rank)], env=env, cwd=tmp_path,
                         stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    for w in workers:
        _, err = w.communicate(timeout=300)
        if w.returncode != 0:
            server.kill()
        assert w.returncode == 0, err[-3000:]
    out, _ = server.communicate(timeout=60)
    log = "\n".join(lines)
    assert server.returncode == 0, log[-3000:]
    assert "the initial model" in log and "came from worker 0" in log, log[-3000:]
    summary = json.loads(out)
    assert summary["model"] == "vector from worker 0" and summary["params"] == dim
    curve = summary["loss_curve"]
    assert len(curve["points"]) == summary["updates"] == 500, summary["updates"]
    assert curve["window"] == 10 and curve["target_loss"] == 0.5
    assert curve["time_to_target_loss_s"] is not None, curve["final_mean_loss"]
    assert curve["final_mean_loss"] < curve["points"][0]["loss"]
    # The saved vector is the server's final model: load it into the model and test it.
    st.load_vector(model, np.load(saved))
    data = syncopate.load_mnist5k()
    x, y = torch.from_numpy(data["x_test"]).view(-1, 1, 28, 28), torch.from_numpy(data["y_test"])
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"serve --init-from-worker: test accuracy {accuracy:.3f} after {summary['updates']} updates, "
          f"{summary['time_s']:.1f} s; time to loss 0.5: {curve['time_to_target_loss_s']:.1f} s")
    assert accuracy >= 0.90, accuracy


def test_serve_init_from_worker_refuses_a_worker_0_of_another_size(syncopate_bin, tmp_path) -> None:
    model = make_model()
    dim = sum(p.numel() for p in model.parameters())
    server, address, lines = start_server(
        syncopate_bin,
        ["--workers", "1", "--init-from-worker", "--dim", str(dim + 1), "--time-limit", "5",
         "--save", str(tmp_path / "never.npy")],
    )
    with pytest.raises(syncopate.WorkerError, match=rf"the server's model has {dim + 1} parameters, worker 0's has {dim}"):
        st.train_worker(model, torch.nn.functional.cross_entropy, [(torch.zeros(1, 1, 28, 28), torch.zeros(1).long())],
                        connect=address, id=0, log=lambda line: None)
    server.wait(30)
    # No model ever arrived: nothing is saved, and the exit code says the run failed.
    assert server.returncode == 1, "\n".join(lines)
    assert not (tmp_path / "never.npy").exists()
    assert any("nothing written: worker 0 never sent the initial parameters" in line for line in lines), lines
