"""A small PyTorch CNN trained on MNIST 5k by two PyTorch worker processes to 0.90 test
accuracy: the guide's scripts, run as written (your own loop under torchrun, and the short
path with Python's `serve` and `train_worker`).

torch is required (see torch_required.py).
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from torch_required import require_torch

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
GUIDE_SCRIPT = EXAMPLES / "pytorch_mnist.py"
SHORT_SCRIPT = EXAMPLES / "pytorch_mnist_short.py"

torch = require_torch()


def test_the_guide_script_trains_the_cnn_to_090_under_torchrun() -> None:
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(GUIDE_SCRIPT)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    m = re.search(r"bsp: test accuracy (\S+) after (\d+) updates", run.stdout)
    assert m, run.stdout + run.stderr[-3000:]
    assert float(m.group(1)) >= 0.90, run.stdout


def test_the_short_script_trains_the_cnn_to_090_with_python_serve() -> None:
    run = subprocess.run([sys.executable, str(SHORT_SCRIPT)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    m = re.search(r"bsp: test accuracy (\S+) after (\d+) updates", run.stdout)
    assert m, run.stdout + run.stderr[-3000:]
    assert float(m.group(1)) >= 0.90, run.stdout


def test_flat_model_keeps_parameters_and_gradients_in_two_contiguous_buffers() -> None:
    import syncopate.torch as st

    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 5), torch.nn.Flatten(), torch.nn.Linear(4 * 24 * 24, 10))
    before = st.parameters_vector(model)
    flat = st.FlatModel(model)
    np.testing.assert_array_equal(flat.params.numpy(), before)
    base, size = flat.params.data_ptr(), 4 * flat.params.numel()
    assert all(base <= p.data_ptr() < base + size for p in model.parameters())
    views = [p.grad for p in model.parameters()]
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    flat.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert all(p.grad is v for p, v in zip(model.parameters(), views)), "backward must accumulate in place"
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.equal(flat.grads, expected) and float(flat.grads.abs().sum()) > 0
    # Writing the buffer (as the worker loop does) changes the model.
    flat.params.numpy()[:] = 0.0
    assert all(float(p.detach().abs().sum()) == 0.0 for p in model.parameters())
    st.load_vector(model, before)
    np.testing.assert_array_equal(st.parameters_vector(model), before)
