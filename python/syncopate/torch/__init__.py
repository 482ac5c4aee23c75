"""PyTorch training with syncopate.

Importing this module imports ``torch`` (``pip install torch``); ``import syncopate`` never
does.

Your own training loop (the Horovod convention), converted from DDP in a few lines:

- :func:`init` -- joins the run: rank and worker count from the launcher (torchrun, mpirun,
  srun) or given; rank 0 hosts the server at ``MASTER_ADDR:MASTER_PORT`` in a thread.
- :class:`DistributedOptimizer` -- wraps your torch optimizer; ``step()`` sends the gradient
  and installs what the protocol hands back (the round's mean gradient, applied by your own
  optimizer, under BSP, backup and DBW; the server's model under the others).
- :func:`shutdown` -- leaves the run; on rank 0 it stops the server and returns its report.
- :func:`rank`, :func:`world_size` -- this process's rank and the number of workers.

The short path, where syncopate runs the loop:

- :func:`train_worker` -- runs a model as one worker of a server (``syncopate.serve`` or
  ``syncopate serve``).
- :func:`parameters_vector` / :func:`load_vector` -- a model's parameters as the server's flat
  float32 vector, and back.
"""

from __future__ import annotations

from ._flat import FlatModel, load_vector, parameters_vector, train_worker
from ._optimizer import DistributedOptimizer
from ._session import Session, init, rank, shutdown, world_size

__all__ = [
    "DistributedOptimizer",
    "FlatModel",
    "Session",
    "init",
    "load_vector",
    "parameters_vector",
    "rank",
    "shutdown",
    "train_worker",
    "world_size",
]
