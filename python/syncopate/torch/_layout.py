"""A model's trainable parameters (and, when they travel, its buffers) as one flat float32
vector in host memory: what a worker sends (the gradient) and what it receives (the model, or
the round's mean gradient).

Layout: every parameter with ``requires_grad``, in ``model.named_parameters()`` order, then
(with buffers) every float or integer buffer in ``model.named_buffers()`` order, each
flattened. The host buffers are pinned when the model is on a GPU, so the copies to and from
the device can be asynchronous: a gradient is copied out once backward is done (one copy of
the concatenated gradients, waited for before it is handed over), and a received vector is
copied in without waiting (the next forward runs after it on the same stream).
"""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np
import torch

_HALF = (torch.float16, torch.bfloat16)

#: Whether a CPU model's vectors take a GPU model's staging path (copies between the device
#: tensors and the host buffers, without pinned memory or a stream to wait for), so that the
#: path runs on a machine without a GPU (set by tests).
STAGE_CPU = False


def check_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The model's parameters, refused with the parameter named if one is not float32 or the
    parameters are on two devices."""
    named = list(model.named_parameters())
    if not named:
        raise ValueError("the model has no parameters")
    first: dict[torch.device, str] = {}
    for name, p in named:
        if p.dtype in _HALF:
            raise ValueError(
                f"parameter {name} is {p.dtype}: syncopate trains float32 parameters; keep them float32 "
                f"(model.float()) and compute in {p.dtype} with torch.autocast"
            )
        if p.dtype != torch.float32:
            raise ValueError(f"parameter {name} is {p.dtype}, not float32: syncopate trains float32 parameters")
        first.setdefault(p.device, name)
    if len(first) > 1:
        (d1, n1), (d2, n2) = list(first.items())[:2]
        raise ValueError(
            f"the model's parameters are on two devices ({n1} on {d1}, {n2} on {d2}): "
            "syncopate trains a model on one device (model.to(device))"
        )
    return named


def _travels(b: torch.Tensor) -> bool:
    return b.dtype.is_floating_point or b.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class Layout:
    """The flat layout of ``model`` and its host staging buffers (see the module's doc)."""

    def __init__(self, model: torch.nn.Module, with_buffers: bool) -> None:
        named = check_parameters(model)
        self.device = named[0][1].device
        self.params = [(name, p) for name, p in named if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no parameter that requires a gradient")
        self.buffers = [(n, b) for n, b in model.named_buffers() if _travels(b)] if with_buffers else []
        self.n_params = sum(p.numel() for _, p in self.params)
        self.dim = self.n_params + sum(b.numel() for _, b in self.buffers)
        #: Whether the vectors are staged through host buffers apart from the model's tensors.
        self.staged = self.device.type != "cpu" or STAGE_CPU
        pin = self.device.type == "cuda"
        # `received`: written by the worker loop (the server's vector); `sent`: the gradient
        # (and buffers) this worker hands over. Both float32, C-contiguous, `dim` long.
        self.received = torch.zeros(self.dim, dtype=torch.float32, pin_memory=pin)
        self.sent = torch.zeros(self.dim, dtype=torch.float32, pin_memory=pin)

    def names(self) -> set[int]:
        """The ids of the trainable parameters."""
        return {id(p) for _, p in self.params}

    def vector(self) -> np.ndarray:
        """The model's current parameters (and buffers), as a new float32 NumPy array."""
        with torch.no_grad():
            parts = [p.detach().reshape(-1) for _, p in self.params]
            parts += [b.detach().reshape(-1).to(self.device, torch.float32) for _, b in self.buffers]
            return torch.cat(parts).to("cpu", torch.float32).numpy().copy()

    def gather(self) -> None:
        """Copies the gradients (a parameter without one counts as zero) and the buffers into
        ``sent``; refuses a step before backward and a gradient with NaN or infinity, naming
        the parameter."""
        grads = [p.grad for _, p in self.params]
        if all(g is None for g in grads):
            raise ValueError("step() before backward: no parameter has a gradient (call loss.backward() first)")
        parts: list[torch.Tensor] = []
        for (name, p), g in zip(self.params, grads):
            if g is None:
                parts.append(torch.zeros(p.numel(), dtype=torch.float32, device=self.device))
            elif g.is_sparse:
                raise ValueError(f"the gradient of parameter {name} is sparse: syncopate sends dense gradients")
            else:
                parts.append(g.detach().reshape(-1).to(torch.float32))
        with torch.no_grad():
            parts += [b.detach().reshape(-1).to(self.device, torch.float32) for _, b in self.buffers]
            if not self.staged:
                torch.cat(parts, out=self.sent)
            else:
                self.sent.copy_(torch.cat(parts), non_blocking=True)
                if self.device.type == "cuda":
                    # The worker loop reads `sent` from another thread: the copy must be done.
                    # This also completes every earlier copy out of `received`.
                    torch.cuda.current_stream(self.device).synchronize()
        grad = self.sent[: self.n_params]
        # One reduction decides: a NaN or an infinity makes the sum NaN or infinite. A sum of
        # finite values can overflow too: the scan by parameter then finds none, and the
        # gradient is sent.
        if not bool(torch.isfinite(grad.sum())):
            offset = 0
            for name, p in self.params:
                n = p.numel()
                if not bool(torch.isfinite(grad[offset : offset + n]).all()):
                    raise ValueError(f"the gradient of parameter {name} has NaN or infinity: not sent")
                offset += n

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        """``host`` (a vector in host memory) where the model is: itself for an unstaged
        model, else a copy on the model's device (asynchronous from pinned memory: the next
        forward runs after it on the same stream)."""
        return host if not self.staged else host.to(self.device, non_blocking=True, copy=True)

    def _source(self) -> torch.Tensor:
        return self.to_device(self.received)

    def _parts(self, src: torch.Tensor, tensors: Iterable[tuple[str, torch.Tensor]], offset: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        for _, t in tensors:
            n = t.numel()
            yield t, src[offset : offset + n].view(t.shape)
            offset += n

    def install_parameters(self, src: Optional[torch.Tensor] = None) -> None:
        """Copies the received vector's parameter part into the parameters."""
        src = self._source() if src is None else src
        with torch.no_grad():
            for p, v in self._parts(src, self.params, 0):
                p.copy_(v)

    def install_gradients(self, src: torch.Tensor) -> None:
        """Makes the received vector's parameter part every parameter's gradient."""
        with torch.no_grad():
            grads, views = [], []
            for p, v in self._parts(src, self.params, 0):
                if p.grad is None:
                    p.grad = v.clone()
                else:
                    grads.append(p.grad)
                    views.append(v)
            if grads:
                # One call for every parameter (the loop of copies where torch lacks it).
                copy = getattr(torch, "_foreach_copy_", None)
                if copy is not None:
                    copy(grads, views)
                else:
                    for g, v in zip(grads, views):
                        g.copy_(v)

    def install_buffers(self, src: torch.Tensor) -> None:
        """Copies the received vector's buffer part into the buffers (integers rounded)."""
        with torch.no_grad():
            for b, v in self._parts(src, self.buffers, self.n_params):
                b.copy_(v if b.dtype.is_floating_point else v.round())
