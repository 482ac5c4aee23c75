"""Type stubs of the native module (see ``syncopate/__init__.py``)."""

from typing import Any, Callable, Literal, Optional, Union

import numpy as np
import numpy.typing as npt

Float32Array = npt.NDArray[np.float32]
Event = dict[str, Any]
ProtocolName = Literal["bsp", "asp", "ssp", "bap", "backup", "dbw", "wbsp", "wbsp-overlap", "grouped"]

PROTOCOLS: tuple[ProtocolName, ...]
"""Every protocol's name, in the order tables list them (the core's ``ProtocolKind::ALL``)."""

BUILD: Literal["debug", "release"]
"""How the native module was compiled: timings mean something only from ``release``."""

class RejectedError(ValueError):
    """A state machine refused an input; nothing changed."""

class WorkerError(RuntimeError):
    """A TCP worker ended with an error (its cause, e.g. the callback's exception, is chained)."""

RuleName = Literal["sgd", "momentum", "nesterov", "adamw", "mean"]

class Optimizer:
    """The server's update rule (``syncopate serve --optimizer``), applied to every update of
    the server's model at the protocol's learning rate scheduled by update count.

    ``rule``: ``"sgd"``; ``"momentum"`` (heavy ball, PyTorch's ``SGD(momentum=...)``);
    ``"nesterov"`` (``SGD(momentum=..., nesterov=True)``, ``momentum`` in (0, 1));
    ``"adamw"`` (PyTorch's ``AdamW``: ``betas``, ``eps``, decoupled ``weight_decay``; note
    PyTorch's own default weight decay is 0.01); ``"mean"``: the relay for optimizers on the
    workers (BSP, backup and DBW only): after each round the server's vector is the round's
    mean gradient, and every worker applies it with its own optimizer (no learning rate or
    schedule here, no ``evaluate``). A knob the rule does not take is refused.
    ``schedule``: None (constant), ``"step:EVERY:GAMMA"`` or
    ``"warmup-cosine:WARMUP:TOTAL[:FLOOR]"``. Every bad setting raises ValueError naming it."""

    def __init__(
        self,
        rule: RuleName = "sgd",
        *,
        momentum: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        schedule: Optional[str] = None,
    ) -> None: ...
    @property
    def rule(self) -> RuleName: ...
    @property
    def momentum(self) -> float: ...
    @property
    def betas(self) -> tuple[float, float]: ...
    @property
    def eps(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def schedule(self) -> Optional[str]:
        """The schedule as the CLI spells it; None for a constant rate."""
    def state_len(self, dim: int) -> int:
        """Elements of state the server keeps for a model of ``dim`` parameters."""

class Protocol:
    """A synchronization protocol and its knobs, as the ``syncopate`` CLI's ``--protocol``
    flags spell them (the same defaults, so a Python worker matches ``syncopate serve``).
    Without ``workers``, the launcher's world size (``WORLD_SIZE``, ``OMPI_COMM_WORLD_SIZE``,
    ``SLURM_NTASKS``, ``PMI_SIZE``); outside a launcher that is a ValueError."""

    def __init__(
        self,
        name: ProtocolName = "bsp",
        workers: Optional[int] = None,
        lr: float = 0.5,
        *,
        staleness: Optional[int] = None,
        iteration_timeout_ms: Optional[float] = None,
        backup_workers: Optional[int] = None,
        interrupt: Literal["abort", "complete"] | None = None,
        k_min: Optional[int] = None,
        groups: Optional[int] = None,
        group_lr_scaling: Literal["linear", "none", "sqrt"] | None = None,
        round_deadline_ms: Optional[float] = None,
        stall_report_ms: Optional[float] = None,
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def workers(self) -> int: ...
    def server_scratch_len(self, dim: int) -> int: ...
    def worker_scratch_len(self, dim: int) -> int: ...

class Server:
    """A parameter server updating ``params`` (float32, C-contiguous, writable) in place;
    ``momentum`` in ``[0, 1)``: SGD with (heavy-ball) momentum on every update (0: plain SGD)."""

    def __init__(self, protocol: Protocol, params: Float32Array, version: int = 0, momentum: float = 0.0) -> None: ...
    def handle(self, now_ns: int, worker: int, message: bytes) -> bool:
        """Feeds a wire message from ``worker``: True if taken, False if it repeated a message
        already received (a worker's retry; dropped and counted). Raises RejectedError for any
        other refusal (nothing changed) or ValueError (malformed bytes)."""
    def handle_worker_lost(self, now_ns: int, worker: int) -> None: ...
    def handle_timeout(self, now_ns: int) -> None: ...
    def poll_output(
        self,
    ) -> Union[
        None,
        tuple[Literal["send"], Optional[int], bytes],
        tuple[Literal["event"], Event],
        tuple[Literal["upstream"], bytes],
    ]:
        """The next output: ``("send", worker or None for all, bytes)``, ``("event", dict)``,
        ``("upstream", bytes)`` (a message for the server above; servers made here have none
        and never output it) or ``None`` when drained."""
    def poll_timeout(self) -> Optional[int]: ...
    def stop(self) -> None: ...
    @property
    def version(self) -> int: ...
    @property
    def params(self) -> Float32Array:
        """The array passed in (the live model)."""
    def stats(self) -> dict[str, Any]: ...

class Worker:
    """A worker holding its copy of the model in ``params`` (float32, C-contiguous, writable)."""

    def __init__(
        self,
        protocol: Protocol,
        id: int,
        params: Float32Array,
        epoch: int = 0,
        rejoin_after_ns: Optional[int] = None,
    ) -> None: ...
    def handle(self, now_ns: int, message: bytes) -> bool:
        """Feeds a wire message from the server: True if taken, False if it repeated a
        message already received (dropped). Raises RejectedError for any other refusal."""
    def handle_gradient(self, now_ns: int, compute_id: int, grad: Float32Array, loss: Optional[float] = None) -> None:
        """Hands in the gradient of job ``compute_id`` (read in place, no copy), with the
        minibatch loss it was computed with, if any (sent to the server with it)."""
    def handle_timeout(self, now_ns: int) -> None: ...
    def poll_output(
        self,
    ) -> Union[
        None,
        tuple[Literal["send"], bytes],
        tuple[Literal["compute"], int, int, Float32Array],
        tuple[Literal["event"], Event],
    ]:
        """The next output; a ``("compute", compute_id, version, params)`` hands out the
        worker's own array (no copy): compute the gradient before the next call."""
    def poll_timeout(self) -> Optional[int]: ...
    def stats(self) -> dict[str, Any]:
        """Counters: ``outputs_lost`` (outputs that found the queue full: zero unless there is a bug)."""
    @property
    def is_stopped(self) -> bool: ...
    @property
    def id(self) -> int: ...

def run_worker(
    connect: Optional[str],
    compute: Callable[[Float32Array, Float32Array], float],
    *,
    id: Optional[int] = None,
    secret_file: Optional[str] = None,
    params: Optional[Float32Array] = None,
    grad: Optional[Float32Array] = None,
    give_up_after_s: float = 30.0,
    log: Optional[Callable[[str], object]] = None,
    initial: Optional[Union[Float32Array, Callable[[], Float32Array]]] = None,
    lost_after_s: float = 10.0,
    on_round: Optional[Callable[[Float32Array, int], object]] = None,
    optional_loss: bool = False,
    wire: Optional[str] = None,
) -> dict[str, Any]:
    """Runs worker ``id`` of the server at ``connect`` until the server says stop; the protocol
    and the model's size come from the server. Without ``id``, the launcher's rank (the run's
    worker count must then be the launcher's world size); ``connect=None`` is
    ``MASTER_ADDR:MASTER_PORT``. ``compute(params, grad)`` fills ``grad`` and
    returns the minibatch loss. ``params``/``grad``: the caller's own float32 arrays of the
    model's size, written and read in place. A ``compute`` that raises or returns a
    non-number ends the worker (the server sees it lost) with WorkerError; with
    ``optional_loss=True`` it may return ``None`` (that gradient travels without a loss).
    ``lost_after_s``: a server silent this long (no message, no heartbeat) is lost and the
    worker reconnects; heartbeats go out every tenth of it. ``wire``: the tensor encoding to
    insist on (``"f32"``, ``"bf16"`` or ``"fp16"``); a server that speaks another refuses the
    worker at the handshake (WorkerError naming both); ``None`` takes the server's.

    ``on_round(vector, version)``: called for every model the server sends, in version order,
    before the next ``compute`` (under ``Optimizer("mean")``, each round's mean gradient); a
    round that never reached the worker ends it with WorkerError."""

def serve(
    params: Float32Array,
    protocol: Protocol,
    *,
    listen: str = "127.0.0.1:0",
    secret_file: Optional[str] = None,
    insecure: bool = False,
    optimizer: Optional[Optimizer] = None,
    momentum: float = 0.0,
    evaluate: Optional[Callable[[Float32Array], Any]] = None,
    every: int = 1,
    target: Optional[float] = None,
    updates: Optional[int] = None,
    gradients: Optional[int] = None,
    time_limit_s: Optional[float] = None,
    on_listen: Optional[Callable[[str], object]] = None,
    log: Optional[Callable[[str], object]] = None,
    record_trace: Optional[str] = None,
    wait_for_rejoin: bool = False,
    lost_after_s: float = 10.0,
    stop_when: Optional[Callable[[int, int], object]] = None,
    wire: str = "f32",
    shared_memory: bool = True,
) -> dict[str, Any]:
    """Runs the TCP parameter server of ``protocol`` on ``params`` (float32, updated in place)
    until ``updates`` model updates, ``gradients`` accepted gradients, ``time_limit_s``
    seconds from the call (evaluations excluded) or ``evaluate``'s result reaching ``target``.
    ``optimizer``: the update rule (plain SGD by default); ``momentum`` (beta in [0, 1)) is
    the shorthand for ``Optimizer("momentum", momentum=beta)``, refused beside
    ``optimizer``. ``evaluate(view)``
    runs on the server's thread every ``every`` updates with a read-only view of the model;
    its time is excluded from the report's times and the time limit. Ctrl-C stops the run
    cleanly and returns the report (reason ``"interrupted"``). A server still waiting for
    workers names them every stall report interval; one whose every worker has been lost
    stops after the server's ``lost_after`` (reason ``"all_workers_lost"``) unless
    ``wait_for_rejoin``. ``lost_after_s``: a worker silent this long (no message, no
    heartbeat) is lost; heartbeats go out every tenth of it. ``record_trace``: a
    path; the workers send their step times and the server writes them, with each step's
    loss and gradient norms, as a trace for ``syncopate advise --trace`` (the report's
    ``trace_steps`` counts its rows). ``stop_when(live, joined)``: called every few
    milliseconds with the number of workers connected and the number that ever joined (each
    worker counted once); the run stops (reason ``"stopped"``) when it
    returns true, and an exception it raises stops the run and is raised. ``wire``: the
    tensor encoding of gradients and models on the wire, ``"f32"``, ``"bf16"`` or ``"fp16"``
    (half the bytes, rounded to nearest even); the server sums, applies and keeps ``params``
    in float32, and a worker asking for another encoding is refused at the handshake.
    ``shared_memory``: offer each worker session a shared-memory region; a worker on this
    host then sends its gradients and receives its models through it (``False``: every
    session stays on TCP; a compressed ``wire`` keeps every session on TCP too)."""

def compare(
    path: Optional[str] = None,
    *,
    text: Optional[str] = None,
    preset: Optional[str] = None,
    jobs: int = 2,
) -> dict[str, Any]:
    """The simulator's protocol comparison (``syncopate compare``) of a scenario file, TOML
    text, preset or the default: ``{"scenario", "target_accuracy", "fastest", "rows"}``."""

RANK_VARIABLES: tuple[str, ...]
"""The variables a launcher's rank is read from, in order (never ``LOCAL_RANK``)."""

WORLD_SIZE_VARIABLES: tuple[str, ...]
"""The variables a launcher's world size is read from, in order."""

def rank_from_env() -> Optional[tuple[int, str]]:
    """``(rank, variable)`` from the launcher's environment, or None outside a launcher."""

def world_size_from_env() -> Optional[tuple[int, str]]:
    """``(world size, variable)`` from the launcher's environment, or None outside a launcher."""

def server_address_from_env() -> Optional[str]:
    """``MASTER_ADDR:MASTER_PORT``, or None unless both are set."""

def digits_split(
    seed: int = 1,
) -> tuple[bytes, list[int], bytes, list[int], int, int]: ...
def mnist5k_split(
    seed: int = 1,
) -> tuple[bytes, list[int], bytes, list[int], int, int]: ...
