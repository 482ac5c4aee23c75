"""The short path: a PyTorch model as a syncopate worker whose loop syncopate runs, and its
parameters as the server's initial model.

- :func:`parameters_vector` -- a model's parameters as one flat float32 NumPy array (a copy),
  in ``model.parameters()`` order: the server's initial model (``syncopate.serve``).
- :func:`load_vector` -- copies such a vector into a model's parameters (to evaluate the
  server's model).
- :func:`train_worker` -- runs the model as one worker of a server: the model's parameters
  and gradients are re-pointed at views of two contiguous float32 buffers, which the worker
  loop writes (the model) and reads (the gradient) in place, so a step copies nothing
  beyond what the transport must.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch

from .. import run_worker

__all__ = ["FlatModel", "load_vector", "parameters_vector", "train_worker"]


def _parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    params = list(model.parameters())
    if not params:
        raise ValueError("the model has no parameters")
    for name, p in model.named_parameters():
        if p.dtype != torch.float32:
            raise ValueError(f"parameter {name} is {p.dtype}: syncopate trains float32 parameters (model.float())")
        if p.device.type != "cpu":
            raise ValueError(f"parameter {name} is on {p.device}: the worker loop reads CPU memory (model.cpu())")
    return params


def parameters_vector(model: torch.nn.Module) -> np.ndarray:
    """The model's parameters, flattened in ``model.parameters()`` order, as a new float32
    NumPy array (the initial model for ``syncopate.serve``)."""
    params = _parameters(model)
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for p in params]).numpy().copy()


def load_vector(model: torch.nn.Module, vector: np.ndarray) -> None:
    """Copies ``vector`` (a flat float32 array in :func:`parameters_vector`'s layout, such as
    the read-only view ``serve`` hands ``evaluate``) into the model's parameters, in place:
    the model never shares the vector's memory, and a parameter that is a view of a worker's
    buffer (:func:`train_worker`) stays one."""
    params = _parameters(model)
    # A private copy: the caller's array may be read-only or change later.
    flat = torch.from_numpy(np.array(vector, dtype=np.float32, copy=True).reshape(-1))
    total = sum(p.numel() for p in params)
    if flat.numel() != total:
        raise ValueError(f"the vector has {flat.numel()} elements; the model has {total} parameters")
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n


class FlatModel:
    """A model whose parameters and gradients are views of two contiguous float32 buffers
    (``params`` and ``grads``, 1-D tensors in ``model.parameters()`` order).

    Building one copies the current parameters into ``params`` once. Backward then
    accumulates into ``grads`` in place (autograd adds into an existing ``.grad``).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        params = _parameters(model)
        total = sum(p.numel() for p in params)
        self.model = model
        self.params = torch.empty(total, dtype=torch.float32)
        self.grads = torch.zeros(total, dtype=torch.float32)
        self._views: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                view = self.params[offset : offset + n].view_as(p)
                view.copy_(p)
                p.data = view
                p.grad = self.grads[offset : offset + n].view_as(p)
                self._views.append((p, p.grad))
                offset += n

    def zero_grad(self) -> None:
        """Zeroes the gradient buffer; re-points a gradient that something replaced (e.g.
        ``optimizer.zero_grad()`` setting it to None) back at its view."""
        self.grads.zero_()
        for p, view in self._views:
            if p.grad is not view:
                p.grad = view

    def gather_grads(self) -> None:
        """After backward: copies any gradient that autograd did not accumulate in place (a
        parameter whose ``.grad`` was replaced) into the buffer."""
        for p, view in self._views:
            if p.grad is not None and p.grad is not view:
                view.copy_(p.grad)
                p.grad = view


def train_worker(
    model: torch.nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    batches: Iterable[Any],
    connect: Optional[str] = None,
    id: Optional[int] = None,
    secret_file: Optional[str] = None,
    **options: Any,
) -> dict[str, Any]:
    """Trains ``model`` as one worker of the server at ``connect`` until the server says stop.

    Each step takes the next ``(inputs, targets)`` from ``batches`` (iterated again when it
    runs out, so a ``DataLoader`` starts a new epoch), computes ``loss_fn(model(inputs),
    targets)`` at the server's current model, backpropagates, and hands the gradient and the
    loss to the server. ``id`` defaults to the launcher's rank (``RANK``,
    ``OMPI_COMM_WORLD_RANK``, ``SLURM_PROCID``, ``PMI_RANK``; the run's worker count must then
    be the launcher's world size) and ``connect=None`` to ``MASTER_ADDR:MASTER_PORT``. As
    worker 0 of a server started with ``syncopate serve --init-from-worker``, it sends the
    model's parameters (:func:`parameters_vector`'s layout) as the server's initial model. Other options go to
    :func:`syncopate.run_worker`. Returns the worker's report; raises
    :class:`syncopate.WorkerError` if the step raises (the worker leaves the server).
    """
    flat = FlatModel(model)
    source: Iterable[Any] = batches
    # A re-iterable (list, DataLoader) starts a new epoch when it runs out; a one-shot
    # iterator (iter(x) is x) cannot, and running out of it is an error.
    current = iter(source)

    def next_batch() -> Any:
        nonlocal current
        try:
            return next(current)
        except StopIteration:
            if current is source:
                raise ValueError("batches ran out: pass a re-iterable (a list, a DataLoader)") from None
            current = iter(source)
            try:
                return next(current)
            except StopIteration:
                raise ValueError("batches is empty") from None

    def compute(params: np.ndarray, grad: np.ndarray) -> float:
        # `params` and `grad` are the flat buffers themselves (passed below): the worker loop
        # has already written the model into the parameters.
        inputs, targets = next_batch()
        flat.zero_grad()
        model.train()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        flat.gather_grads()
        return float(loss.detach())

    return run_worker(
        connect,
        compute,
        id=id,
        secret_file=secret_file,
        params=flat.params.numpy(),
        grad=flat.grads.numpy(),
        # Read when a server asks worker 0 for its initial model (at the start of a session);
        # at the first session the buffer holds the model's own parameters.
        initial=options.pop("initial", flat.params.numpy()),
        **options,
    )
