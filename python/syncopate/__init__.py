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
- :func:`run_worker` -- one worker of ``syncopate serve`` over TCP, whose gradient is
  computed by a Python callback ``compute(params, grad)`` writing into ``grad``.
- :func:`compare` -- the simulator's protocol comparison, as a dict.
- :func:`load_digits` -- the digits data, split exactly as ``syncopate serve`` splits it.
"""

from __future__ import annotations

import numpy as np

from ._native import (
    PROTOCOLS,
    Protocol,
    RejectedError,
    Server,
    Worker,
    WorkerError,
    compare,
    digits_split,
    run_worker,
)

__all__ = [
    "PROTOCOLS",
    "Protocol",
    "RejectedError",
    "Server",
    "Worker",
    "WorkerError",
    "compare",
    "load_digits",
    "run_worker",
]


def load_digits(seed: int = 1) -> dict[str, np.ndarray]:
    """The built-in digits data set (1797 8x8 images, 10 classes), split 80/20 with ``seed``
    exactly as ``syncopate serve --seed SEED`` splits it.

    Returns ``{"x_train", "y_train", "x_test", "y_test"}``: float32 feature matrices (one
    row per image, 64 columns) and int64 label vectors.
    """
    x_train, y_train, x_test, y_test, n_features, _ = digits_split(seed)
    return {
        "x_train": np.frombuffer(x_train, dtype="<f4").reshape(-1, n_features).astype(np.float32),
        "y_train": np.asarray(y_train, dtype=np.int64),
        "x_test": np.frombuffer(x_test, dtype="<f4").reshape(-1, n_features).astype(np.float32),
        "y_test": np.asarray(y_test, dtype=np.int64),
    }
