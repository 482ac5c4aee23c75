""":class:`DistributedOptimizer`: your torch optimizer, wrapped so that ``step()`` trains
through the run's protocol (see :func:`syncopate.torch.init`)."""

from __future__ import annotations

import gc
import math
import weakref
from typing import Any, Callable, Optional

import torch
from torch.optim.lr_scheduler import LRScheduler

from . import _session
from ._layout import Layout


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer`` (any ``torch.optim.Optimizer`` over ``model``'s parameters) so that
    the training loop stays as written: ``zero_grad()``, forward, ``loss.backward()`` (several
    times to accumulate), ``clip_grad_norm_``, ``step()``, ``scheduler.step()``.

    Making it connects (:func:`syncopate.torch.init` first): rank 0 starts the server on its
    model, and every worker installs the server's initial model, so every rank starts from
    rank 0's parameters and buffers. On rank 0 it returns once every worker has connected
    (at most ``connect_timeout_s``).

    ``step(loss=None)`` sends the accumulated gradients (and ``loss``, a number or a one-element
    tensor, for the server's loss curve; none without it) and returns once the protocol hands
    back the next vector:

    - rule ``"mean"`` (BSP, backup, DBW by default): the vector is the round's mean gradient
      (and the mean of the workers' buffers); ``step()`` writes it into ``.grad`` and calls
      your optimizer, so every worker applies the same update and the models stay identical.
      A worker whose gradient a round did not need (backup, DBW) applies every round it
      missed in its next ``step()``, and the LR schedulers built on this optimizer step
      between those rounds (your ``scheduler.step()`` after ``step()`` makes the last one),
      so every round is applied at the same learning rate on every worker.
    - any other rule: the server's optimizer updated the model; ``step()`` installs it and
      your optimizer is not called. A torch LR scheduler then cannot be honoured and is
      refused, unless ``server_schedule=True`` says the server's :class:`syncopate.Optimizer`
      carries the schedule (refused when the server this run hosts has none).

    Once the server has stopped, ``should_stop`` is true and ``step()`` returns without
    sending. A bad step (before backward, a NaN or infinite gradient) makes this worker leave
    the server (it is counted lost) and raises ``ValueError`` naming the parameter; a vector
    that does not come within ``step_timeout_s`` raises ``TimeoutError``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, *,
                 server_schedule: bool = False) -> None:
        # The wrapped optimizer owns the parameter groups and state; this object shares them
        # (an LR scheduler built on it changes the wrapped optimizer's learning rates).
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        session = _session.current()
        self._inner = optimizer
        self._session = session
        self._server_schedule = server_schedule
        try:
            self._layout = layout = self._check(optimizer, model)
        except (ValueError, TypeError):
            session.abandon()
            raise
        self._lrs = [group.get("lr") for group in optimizer.param_groups]
        self.should_stop = False
        #: Under the rule "mean": the last round applied (its version).
        self.rounds = 0
        self._last_round: Optional[torch.Tensor] = None
        self._found_schedulers: Optional[list[weakref.ref[Any]]] = None
        self._left: Optional[str] = None
        session.start(layout.received.numpy(), layout.sent.numpy(), layout.vector())
        session.on_close.append(self._install_server_model)
        self._receive()
        try:
            session.wait_for_workers()
        except TimeoutError as e:
            self._leave(str(e))
            raise

    def _check(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> Layout:
        session = self._session
        layout = Layout(model, with_buffers=session.worker_side)
        owned = {id(p): name for name, p in model.named_parameters()}
        in_optimizer: set[int] = set()
        for i, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if id(p) not in owned:
                    raise ValueError(f"parameter group {i} of the optimizer holds a tensor of shape {tuple(p.shape)} "
                                     "that is not a parameter of the model")
                in_optimizer.add(id(p))
        if not session.worker_side:
            for name, p in layout.params:
                if id(p) not in in_optimizer:
                    raise ValueError(f"parameter {name} is not in the optimizer, but under {session.protocol.name} "
                                     "the server's optimizer updates every parameter that requires a gradient")
            rule = session.optimizer
            if self._server_schedule and not session.server_apart and getattr(rule, "schedule", None) in (None,
                                                                                                      "constant"):
                # The server this run hosts keeps one rate: a torch scheduler kept for show
                # would change nothing.
                what = "the default SGD" if rule is None else f"syncopate.Optimizer({rule.rule!r})"
                raise ValueError(f"server_schedule=True, but the server's optimizer ({what}) has no schedule: give "
                                 f"it one (init(optimizer=syncopate.Optimizer(..., schedule=...))); under "
                                 f"{session.protocol.name} a torch LR scheduler cannot change the server's rate")
        return layout

    # The wrapped optimizer's state, shared.
    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        return self._inner.param_groups

    @property  # type: ignore[override]
    def state(self) -> Any:
        return self._inner.state

    @property  # type: ignore[override]
    def defaults(self) -> dict[str, Any]:
        return self._inner.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self._inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._inner.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise RuntimeError("add_param_group after DistributedOptimizer: the model's layout is fixed; "
                           "add the group to the optimizer before wrapping it")

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._inner!r})"

    def _leave(self, why: str) -> None:
        self._left = why
        bridge = self._session.bridge
        if bridge is not None:
            bridge.leave()

    def _receive(self) -> bool:
        """Waits for the next vector and installs it; False once the run has ended."""
        bridge = self._session.bridge
        assert bridge is not None
        try:
            arrived = bridge.wait(self._session.step_timeout_s)
        except TimeoutError as e:
            self._leave(str(e))
            raise
        if self._session.worker_side:
            # Every round received, the last ones before a stop included. The caller's LR
            # schedulers step once per step() (after it): when this step() applies several
            # rounds (a worker catching up on rounds its gradient was not needed for), they
            # step between them, so every round is applied at the learning rate every other
            # worker applied it at.
            applied = 0
            for version, vector in bridge.take_rounds():
                if version > 0:
                    if applied:
                        self._step_schedulers()
                    applied += 1
                self._apply_round(version, torch.from_numpy(vector))
        elif arrived:
            self._layout.install_parameters()
        if not arrived:
            self.should_stop = True
            if self._last_round is not None and self._layout.buffers:
                # The forward before this step moved the buffers after the last round: the
                # model stays as the last round made it, identical on every worker.
                self._layout.install_buffers(self._last_round)
            if bridge.error is not None and not bridge.leaving:
                error = bridge.error
                self._left = f"the worker ended: {error}"
                raise error
            return False
        return True

    def _schedulers(self) -> list[Any]:
        """The LR schedulers built on this optimizer (found once, the first time a step
        applies several rounds): a composite one (``SequentialLR``, ``ChainedScheduler``)
        in place of the schedulers it holds."""
        if self._found_schedulers is None:
            found: dict[int, Any] = {}
            for ref in gc.get_referrers(self):
                owners = [ref]
                if isinstance(ref, dict) and ref.get("optimizer") is self:
                    # The scheduler's attribute dictionary: the scheduler is its owner.
                    owners = [o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref]
                for o in owners:
                    if isinstance(o, LRScheduler) and getattr(o, "optimizer", None) is self:
                        found[id(o)] = o
            held = {id(s) for o in found.values() for s in getattr(o, "_schedulers", ())}
            self._found_schedulers = [weakref.ref(o) for i, o in found.items() if i not in held]
        return [s for s in (r() for r in self._found_schedulers) if s is not None]

    def _step_schedulers(self) -> None:
        for sched in self._schedulers():
            if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                why = ("a ReduceLROnPlateau scheduler cannot step for the rounds this worker catches up on (its "
                       "step needs the metric): under the rule mean, schedule by step (LambdaLR, "
                       "CosineAnnealingLR...) so that every worker keeps the same learning rate; this worker left")
                self._leave(why)
                raise ValueError(why)
            sched.step()

    def _apply_round(self, version: int, vector: torch.Tensor) -> None:
        # Version 0 is the initial model (rank 0's); every later version one round's mean
        # gradient (and mean buffers), applied by the wrapped optimizer, in version order, so
        # a worker whose gradient a round did not need still applies that round.
        layout = self._layout
        src = layout.to_device(vector)
        if version == 0:
            layout.install_parameters(src)
        else:
            layout.install_gradients(src[: layout.n_params])
            self._inner.step()
        if layout.buffers:
            layout.install_buffers(src)
        self.rounds = version
        self._last_round = src

    def step(self, closure: Optional[Callable[[], float]] = None, *, loss: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise TypeError("DistributedOptimizer.step() takes no closure: call backward before step()")
        if self._left is not None:
            raise RuntimeError(f"this worker has left the server ({self._left}): step() cannot send")
        if self.should_stop:
            return None
        session = self._session
        if not session.worker_side and not self._server_schedule:
            for i, group in enumerate(self._inner.param_groups):
                if "initial_lr" in group or group.get("lr") != self._lrs[i]:
                    why = (f"the learning rate of parameter group {i} is scheduled (a torch LR scheduler), but under "
                           f"{session.protocol.name} the server's optimizer makes every update and cannot honour it: "
                           "give the schedule to syncopate.Optimizer(schedule=...) and pass server_schedule=True")
                    self._leave(why)
                    raise ValueError(why)
        try:
            self._layout.gather()
            value = None if loss is None else float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"step(loss=...) got a loss of {value}: not sent")
        except (ValueError, TypeError, RuntimeError) as e:
            self._leave(str(e))
            raise
        bridge = session.bridge
        assert bridge is not None
        bridge.submit(value)
        self._receive()
        return None

    def _install_server_model(self) -> None:
        # The host's model becomes the server's final model when the server ran the optimizer.
        params = self._session.server_params
        if params is not None and not self._session.worker_side:
            self._layout.install_parameters(self._layout.to_device(torch.from_numpy(params)))
