"""A small PyTorch CNN trained on MNIST 5k by two PyTorch worker processes, to 0.90 test
accuracy: with Python's `serve` (the guide's script, run as written) and with the CLI's
`syncopate serve --init-from-worker`.

torch is required: without it these tests fail, unless $SYNCOPATE_NO_TORCH=1 says torch is
not expected here (then they are skipped).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
GUIDE_SCRIPT = EXAMPLES / "pytorch_mnist.py"

if os.environ.get("SYNCOPATE_NO_TORCH") == "1":
    pytest.skip("$SYNCOPATE_NO_TORCH=1: torch is not expected here", allow_module_level=True)
try:
    import torch  # noqa: F401
except ImportError as e:  # a missing torch is a failure, not a skip
    raise RuntimeError(f"torch is required by these tests ({e}); set SYNCOPATE_NO_TORCH=1 to skip them") from e


def test_the_guide_script_trains_the_cnn_to_090_with_python_serve() -> None:
    run = subprocess.run([sys.executable, str(GUIDE_SCRIPT)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    m = re.search(r"bsp: test accuracy (\S+) after (\d+) updates", run.stdout)
    assert m, run.stdout + run.stderr[-3000:]
    assert float(m.group(1)) >= 0.90, run.stdout


WORKER = """
import sys
sys.path.insert(0, {examples!r})
import pytorch_mnist
pytorch_mnist.worker(sys.argv[1], int(sys.argv[2]))
"""


def test_cli_serve_init_from_worker_trains_the_cnn_to_090(syncopate_bin: pathlib.Path, tmp_path: pathlib.Path) -> None:
    final = tmp_path / "final.npy"
    usage = subprocess.run([str(syncopate_bin), "serve", "--help"], capture_output=True, text=True).stdout
    missing = [flag for flag in ("--init-from-worker", "--save") if flag not in usage]
    if missing:
        pytest.fail(f"syncopate serve has no {', '.join(missing)}: this test needs the server for any model")
    server = subprocess.Popen(
        [str(syncopate_bin), "serve", "--listen", "127.0.0.1:0", "--workers", "2",
         "--protocol", "bsp", "--lr", "0.1", "--init-from-worker", "--steps", "1500", "--save", str(final)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert server.stderr is not None
    addr = None
    deadline = time.monotonic() + 60
    while addr is None and time.monotonic() < deadline:
        line = server.stderr.readline()
        if m := re.search(r"listening on (\S+?),", line):
            addr = m.group(1)
        elif not line and server.poll() is not None:
            break
    if addr is None:
        server.kill()
        pytest.fail(f"syncopate serve did not start: {server.stderr.read()}")
    script = WORKER.format(examples=str(EXAMPLES))
    workers = [
        subprocess.Popen([sys.executable, "-c", script, addr, str(rank)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    for w in workers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err[-3000:]
    _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err[-3000:]
    sys.path.insert(0, str(EXAMPLES))
    try:
        import pytorch_mnist
        import syncopate.torch as st
    finally:
        sys.path.remove(str(EXAMPLES))
    model = pytorch_mnist.make_model()
    st.load_vector(model, np.load(final))
    x_test, y_test = pytorch_mnist.mnist("test")
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    assert accuracy >= 0.90, accuracy


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
