"""syncopate: straggler-tolerant parameter-server synchronization protocols.

The protocols (BSP, ASP, SSP, BAP, static backup workers, DBW, WBSP, grouped hybrid) are
the Rust core's sans-IO state machines:

- :data:`PROTOCOLS` -- every protocol's name.
- :class:`Protocol` -- a protocol and its knobs, spelled as the ``syncopate`` CLI spells
  them, so a Python worker agrees with ``syncopate serve``.
- :class:`Server` / :class:`Worker` -- the state machines over float32 NumPy arrays (the
  model array is updated in place, no copy); messages are ``bytes`` in the core's wire
  format, times integer nanoseconds. Feed an input, drain ``poll_output()`` until it
  returns ``None``, wake up at ``poll_timeout()``.
- :class:`Optimizer` -- the server's update rule (SGD, momentum, Nesterov, AdamW, with a
  learning-rate schedule; or ``"mean"``, the relay for optimizers on the workers).
- :func:`serve` -- the TCP parameter server on a float32 NumPy array (the live model), with
  an optional ``evaluate(view)`` (a read-only view of the model) every K updates.
- :func:`run_worker` -- one worker of a TCP server (``serve`` or ``syncopate serve``): the
  protocol and the model's size come from the server; a Python callback
  ``compute(params, grad)`` fills ``grad`` and returns the minibatch loss.
- :mod:`syncopate.torch` -- PyTorch: your own training loop (``init``,
  ``DistributedOptimizer``, ``shutdown``), or a model as a worker whose loop syncopate runs
  (``train_worker``); imports torch only when used.
- :func:`compare` -- the simulator's protocol comparison, as a dict.
- :func:`load_digits` -- the digits data, split exactly as ``syncopate serve`` splits it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ._native import (
    PROTOCOLS,
    RANK_VARIABLES,
    WORLD_SIZE_VARIABLES,
    Optimizer,
    Protocol,
    RejectedError,
    Server,
    Worker,
    WorkerError,
    compare,
    digits_split,
    mnist5k_split,
    rank_from_env,
    serve,
)
from ._native import run_worker as _run_worker

__all__ = [
    "PROTOCOLS",
    "Optimizer",
    "Protocol",
    "RANK_VARIABLES",
    "WORLD_SIZE_VARIABLES",
    "RejectedError",
    "Server",
    "Worker",
    "WorkerError",
    "compare",
    "load_digits",
    "load_mnist5k",
    "run_worker",
    "serve",
    "worker_id_from_env",
]

def worker_id_from_env() -> int:
    """This process's worker id from the launcher's environment: the first of ``RANK``
    (torchrun), ``OMPI_COMM_WORLD_RANK`` (Open MPI), ``SLURM_PROCID`` (Slurm) and
    ``PMI_RANK`` (MPICH) that is set, as ``syncopate work`` reads it (never ``LOCAL_RANK``,
    which repeats on every machine). A rank at or above the same launcher's world size is
    refused."""
    found = rank_from_env()
    if found is None:
        raise ValueError("no worker id: pass id= or set one of $" + ", $".join(RANK_VARIABLES))
    return found[0]


def run_worker(
    connect: Optional[str],
    compute: Callable[[np.ndarray, np.ndarray], Any],
    id: Optional[int] = None,
    secret_file: Optional[str] = None,
    **options: Any,
) -> dict[str, Any]:
    """Runs one worker of the server at ``connect`` (``host:port``) until the server says stop.

    The protocol and the model's size come from the server. ``compute(params, grad)`` gets
    the current model and a gradient array (float32, the model's length), fills ``grad`` and
    returns the minibatch loss (a number). ``id`` defaults to the launcher's rank
    (:func:`worker_id_from_env`); the run's worker count must then equal the launcher's
    world size (``WORLD_SIZE`` and the like: one process per worker). ``connect=None`` is
    ``MASTER_ADDR:MASTER_PORT``. Options: ``params=`` and ``grad=`` (your own float32 arrays,
    written and read in place), ``give_up_after_s=`` (how long an unreachable server is
    retried), ``log=`` (a function of one line; default: standard error), ``initial=`` (the
    model's initial parameters, a float32 array or a function returning one: worker 0 sends
    them to a server started with ``syncopate serve --init-from-worker``; other workers and
    other servers never use them), ``optional_loss=True`` (``compute`` may return ``None``:
    that gradient travels without a loss).

    A ``compute`` that raises or returns anything but a number ends this worker (the server
    counts it lost) with :class:`WorkerError` naming it. Returns the worker's report.
    """
    return _run_worker(connect, compute, id=id, secret_file=secret_file, **options)


def _arrays(split: tuple[bytes, list[int], bytes, list[int], int, int]) -> dict[str, np.ndarray]:
    x_train, y_train, x_test, y_test, n_features, _ = split
    return {
        "x_train": np.frombuffer(x_train, dtype="<f4").reshape(-1, n_features).astype(np.float32),
        "y_train": np.asarray(y_train, dtype=np.int64),
        "x_test": np.frombuffer(x_test, dtype="<f4").reshape(-1, n_features).astype(np.float32),
        "y_test": np.asarray(y_test, dtype=np.int64),
    }


def load_digits(seed: int = 1) -> dict[str, np.ndarray]:
    """The built-in digits data set (1797 8x8 images, 10 classes), split 80/20 with ``seed``
    exactly as ``syncopate serve --seed SEED`` splits it.

    Returns ``{"x_train", "y_train", "x_test", "y_test"}``: float32 feature matrices (one
    row per image, 64 columns) and int64 label vectors.
    """
    return _arrays(digits_split(seed))


def load_mnist5k(seed: int = 1) -> dict[str, np.ndarray]:
    """The built-in 5,000-image MNIST subset (28x28 grey levels scaled to 0..1, 10 classes,
    500 images each), split 4,000/1,000 with ``seed``; the layout of :func:`load_digits`
    with 784 columns (reshape to ``(-1, 1, 28, 28)`` for a CNN).
    """
    return _arrays(mnist5k_split(seed))
