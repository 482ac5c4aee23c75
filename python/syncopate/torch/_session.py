"""The process's place in a run (:func:`init`): its rank, the protocol, the server's address,
whether this process hosts the server; the server's thread (rank 0) and the worker's thread.

The worker's thread runs :func:`syncopate.run_worker`, whose ``compute`` callback hands
control to the training thread: it says a vector arrived (the server's model, or under the
rule "mean" the round's mean gradient) and waits, with the GIL released, for the next
``step()`` to fill the gradient. So ``step()`` sends the gradient and returns once the
protocol hands back the next vector (BSP: once the round is complete), and the training
thread runs forward and backward while the worker's thread waits.
"""

from __future__ import annotations

import atexit
import collections
import datetime
import os
import sys
import threading
import time
from typing import Any, Callable, Optional, Union

import numpy as np

import syncopate

from .._native import rank_from_env, server_address_from_env, world_size_from_env

#: The protocols that apply one round's mean gradient per update: under them a worker-side
#: optimizer is possible (the server relays the mean, rule "mean").
ROUND_PROTOCOLS = ("bsp", "backup", "dbw")
#: The key the host publishes its address under in torchrun's store.
STORE_KEY = "syncopate/server_address"


class _Leave(Exception):
    """Raised in ``compute`` to make the worker leave the server (its connection dropped)."""


class Bridge:
    """The worker's thread and the hand-over between it and the training thread."""

    def __init__(self, address: str, rank: int, received: np.ndarray, sent: np.ndarray, initial: np.ndarray,
                 secret_file: Optional[str], log: Optional[Callable[[str], object]], give_up_after_s: float,
                 rounds: bool) -> None:
        self._arrived = threading.Event()
        # With `rounds`: every vector the server sends, in version order (`on_round`), taken
        # by the training thread at its next step.
        self._rounds: collections.deque[tuple[int, np.ndarray]] = collections.deque()
        self._submitted = threading.Event()
        self.loss: Optional[float] = None
        self.leaving = False
        self.ended = False
        self.error: Optional[BaseException] = None
        self.report: Optional[dict[str, Any]] = None
        self.vectors = 0
        self.in_compute = False
        self._log = log
        options: dict[str, Any] = dict(id=rank, secret_file=secret_file, params=received, grad=sent, initial=initial,
                                       optional_loss=True, give_up_after_s=give_up_after_s, log=self._say)
        if rounds:
            options["on_round"] = self._on_round
        self._thread = threading.Thread(target=self._run, args=(address, options), name=f"syncopate-worker-{rank}",
                                        daemon=True)
        self._thread.start()

    def _say(self, line: str) -> None:
        # A worker that leaves drops its connection: what the loop logs about that is noise.
        if self.leaving:
            return
        if self._log is None:
            print(f"syncopate worker: {line}", file=sys.stderr, flush=True)
        else:
            self._log(line)

    def _on_round(self, vector: np.ndarray, version: int) -> None:
        self._rounds.append((version, vector))

    def take_rounds(self) -> list[tuple[int, np.ndarray]]:
        """The vectors received since the last call, in version order."""
        taken = []
        while self._rounds:
            taken.append(self._rounds.popleft())
        return taken

    def _compute(self, params: np.ndarray, grad: np.ndarray) -> Optional[float]:
        self.vectors += 1
        self.in_compute = True
        self._arrived.set()
        self._submitted.wait()
        self._submitted.clear()
        self.in_compute = False
        if self.leaving:
            raise _Leave()
        return self.loss

    def _run(self, address: str, options: dict[str, Any]) -> None:
        try:
            self.report = syncopate.run_worker(address, self._compute, **options)
        except syncopate.WorkerError as e:
            if not (self.leaving and isinstance(e.__cause__, _Leave)):
                self.error = e
        except BaseException as e:  # surfaced by the training thread's next step()
            self.error = e
        finally:
            self.ended = True
            self._arrived.set()

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Waits for the next vector; False once the worker has ended (stopped, left or
        failed: see ``error``)."""
        if not self._arrived.wait(timeout_s):
            raise TimeoutError(f"no vector from the server within step_timeout_s={timeout_s} s (a round that "
                               "never completes: a worker that left or never connected?); this worker left")
        self._arrived.clear()
        return not self.ended

    def submit(self, loss: Optional[float]) -> None:
        """Hands the gradient (already in the sent buffer) and the loss to the worker."""
        self.loss = loss
        self._submitted.set()

    def leave(self, timeout_s: float = 10.0) -> None:
        """Leaves the server (it counts this worker lost) and waits for the thread."""
        if not self.ended:
            self.leaving = True
            self._submitted.set()
        # Only a worker waiting in `compute` leaves at once; one waiting on the network (a
        # round that never completes) leaves when the process ends.
        self._thread.join(timeout_s if self.in_compute else 0.1)


class Session:
    """This process's place in the run (see :func:`init`)."""

    def __init__(self, protocol: syncopate.Protocol, rank: int, world: int, address: Optional[str], host: bool,
                 optimizer: Any, store: Any, serve_options: dict[str, Any], secret_file: Optional[str],
                 log: Optional[Callable[[str], object]], give_up_after_s: float, step_timeout_s: float,
                 connect_timeout_s: float) -> None:
        self.protocol = protocol
        self.rank = rank
        self.world = world
        self.address = address
        self.host = host
        self.optimizer = optimizer
        self.rule = getattr(optimizer, "rule", None) if optimizer is not None else None
        self._store = store
        self._serve_options = serve_options
        self._secret_file = secret_file
        self._log = log
        self._give_up_after_s = give_up_after_s
        self.step_timeout_s = step_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.bridge: Optional[Bridge] = None
        self.server_params: Optional[np.ndarray] = None
        self.server_report: Optional[dict[str, Any]] = None
        self.server_error: Optional[BaseException] = None
        self._server_thread: Optional[threading.Thread] = None
        self._closing = False
        #: The host's count of workers that have joined (polled by its server).
        self.joined = 0
        self._close_deadline = 0.0
        self.on_close: list[Callable[[], None]] = []
        #: Whether the server was started apart (``init(server=False)``): its rule is then
        #: known only as far as ``optimizer`` says.
        self.server_apart = False

    @property
    def worker_side(self) -> bool:
        """Whether the workers run the optimizer (the server relays each round's mean)."""
        return self.rule == "mean"

    def _stop_when(self, live: int, joined: int) -> bool:
        self.joined = joined
        # Once this process closes: when every worker has joined and left, or at the deadline.
        return self._closing and ((live == 0 and joined == self.world) or time.monotonic() >= self._close_deadline)

    def _serve(self, listen: str, listening: threading.Event) -> None:
        def on_listen(address: str) -> None:
            self.address = address
            if self._store is not None:
                self._store.set(STORE_KEY, address)
            listening.set()

        options = dict(self._serve_options)
        if self.optimizer is not None:
            options["optimizer"] = self.optimizer
        try:
            assert self.server_params is not None
            self.server_report = syncopate.serve(self.server_params, self.protocol, listen=listen,
                                                 secret_file=self._secret_file, on_listen=on_listen,
                                                 stop_when=self._stop_when, **options)
        except BaseException as e:
            self.server_error = e
        finally:
            listening.set()

    def start(self, received: np.ndarray, sent: np.ndarray, initial: np.ndarray) -> None:
        """Starts the server (when this process hosts it) on ``initial`` and the worker."""
        if self.bridge is not None:
            raise RuntimeError("this process already has a DistributedOptimizer (one per process)")
        if self.host:
            self.server_params = initial.copy()
            listening = threading.Event()
            listen = self.address if self.address is not None else "127.0.0.1:0"
            self._server_thread = threading.Thread(target=self._serve, args=(listen, listening),
                                                   name="syncopate-serve", daemon=True)
            self._server_thread.start()
            listening.wait()
            if self.server_error is not None:
                raise RuntimeError(f"the server could not start at {listen}: {self.server_error}") from self.server_error
        elif self._store is not None:
            self.address = self._store.get(STORE_KEY).decode()
        assert self.address is not None
        self.bridge = Bridge(self.address, self.rank, received, sent, initial, self._secret_file, self._log,
                             self._give_up_after_s, rounds=self.worker_side)

    def wait_for_workers(self) -> None:
        """On the host: waits until every worker has joined (as DDP's start waits for every
        rank), at most ``connect_timeout_s``."""
        deadline = time.monotonic() + self.connect_timeout_s
        while self.host and self.joined < self.world and self.server_error is None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.world - self.joined} of {self.world} workers did not connect within "
                                   f"connect_timeout_s={self.connect_timeout_s} s; this worker left")
            time.sleep(0.01)

    def abandon(self) -> None:
        """Connects and leaves at once, so that the server counts this worker lost rather
        than waiting for it to connect (after a refused ``DistributedOptimizer``)."""
        if self.host or self.bridge is not None:
            return
        address = self.address
        if self._store is not None:
            address = self._store.get(STORE_KEY).decode()

        def leave(params: np.ndarray, grad: np.ndarray) -> float:
            raise _Leave()

        def run() -> None:
            try:
                # `on_round`: a worker without it is refused in the handshake by a server of the
                # rule "mean", and would never join to say it left.
                syncopate.run_worker(address, leave, id=self.rank, secret_file=self._secret_file, log=lambda _: None,
                                     give_up_after_s=min(self._give_up_after_s, 10.0),
                                     on_round=lambda _vector, _version: None)
            except Exception:  # noqa: BLE001 - leaving; the caller raises its own error
                pass

        thread = threading.Thread(target=run, name="syncopate-leave", daemon=True)
        thread.start()
        thread.join(15.0)

    def close(self, timeout_s: float) -> Optional[dict[str, Any]]:
        """Leaves the server; the host then waits up to ``timeout_s`` for the other workers to
        leave, stops the server and returns its report."""
        if self.bridge is not None:
            self.bridge.leave()
        if self._server_thread is None:
            return None
        self._close_deadline = time.monotonic() + timeout_s
        self._closing = True
        self._server_thread.join()
        for f in self.on_close:
            f()
        if self.server_error is not None:
            raise self.server_error
        return self.server_report


_current: Optional[Session] = None


def current() -> Session:
    """The session :func:`init` made."""
    if _current is None:
        raise RuntimeError("call syncopate.torch.init(...) before DistributedOptimizer(...)")
    return _current


def _launcher_store_port() -> bool:
    """Whether torchrun's agent holds ``MASTER_PORT`` (its rendezvous store)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def _launcher_store(address: Optional[str]) -> Any:
    """torchrun's store, when torchrun's agent holds ``MASTER_PORT`` (it then serves its
    rendezvous store there, so the host listens on a port of its own and publishes it)."""
    if address is not None or not _launcher_store_port():
        return None
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=300))


def init(
    protocol: Union[str, syncopate.Protocol] = "bsp",
    *,
    optimizer: Any = None,
    workers: Optional[int] = None,
    rank: Optional[int] = None,
    lr: float = 0.1,
    address: Optional[str] = None,
    server: Optional[bool] = None,
    secret_file: Optional[str] = None,
    updates: Optional[int] = None,
    time_limit_s: Optional[float] = None,
    log: Optional[Callable[[str], object]] = None,
    give_up_after_s: float = 30.0,
    lost_after_s: float = 10.0,
    step_timeout_s: float = 600.0,
    connect_timeout_s: float = 600.0,
    wire: Optional[str] = None,
    **knobs: Any,
) -> Session:
    """Joins a run: this process is worker ``rank`` of ``workers``, and rank 0 hosts the server.

    ``protocol``: a name (with ``lr`` and the protocol's knobs, as :class:`syncopate.Protocol`
    takes them) or a :class:`syncopate.Protocol`. ``workers`` and ``rank`` default to the
    launcher's (``WORLD_SIZE``/``RANK`` for torchrun, and the Open MPI, Slurm and MPICH
    variables); a launcher's world size that differs from ``workers`` is an error.
    ``optimizer``: the server's update rule (a :class:`syncopate.Optimizer`); by default the
    rule ``"mean"`` (your torch optimizer runs on every worker) for BSP, backup and DBW, and
    SGD at ``lr`` on the server for the others; with ``server=False``, the rule of the server
    started apart (``Optimizer("mean")`` for ``syncopate serve --optimizer mean``, else
    none: the server's model is installed). ``address``: where the server listens
    (``HOST:PORT``); by default ``MASTER_ADDR:MASTER_PORT`` (under torchrun, whose agent holds
    that port, a free port published through torchrun's store). ``server``: whether this
    process hosts the server (default: rank 0); ``False`` on every rank joins a server started
    apart (``syncopate serve``). ``updates``/``time_limit_s``: the server's bounds (default:
    none; the run ends at :func:`shutdown`). ``step_timeout_s``: how long ``step()`` waits for
    the protocol's next vector (a round that a lost worker never completes) before this worker
    leaves and raises ``TimeoutError``; ``connect_timeout_s``: how long the host's
    :class:`DistributedOptimizer` waits for every worker to connect (as DDP's start waits for
    every rank). ``wire``: the hosted server's encoding of gradients and models on the wire
    (``"f32"``, the default, ``"bf16"`` or ``"fp16"``; the workers take the server's). Nothing
    connects until :class:`DistributedOptimizer` is made.
    """
    global _current
    if _current is not None:
        raise RuntimeError("syncopate.torch.init() was already called in this process (shutdown() first)")
    launched = world_size_from_env()
    if isinstance(protocol, syncopate.Protocol):
        if knobs:
            raise ValueError(f"protocol knobs {sorted(knobs)} given with a Protocol object: put them in it")
        if workers is not None and workers != protocol.workers:
            raise ValueError(f"workers={workers} but the protocol has {protocol.workers} workers")
        proto = protocol
    else:
        if workers is None and launched is None:
            raise ValueError("no worker count: pass workers= or run under a launcher that sets one of $"
                             + ", $".join(syncopate.WORLD_SIZE_VARIABLES))
        proto = syncopate.Protocol(protocol, workers=workers if workers is not None else launched[0], lr=lr, **knobs)
    if launched is not None and launched[0] != proto.workers:
        raise ValueError(f"${launched[1]}={launched[0]} but the protocol runs {proto.workers} workers: "
                         "start one process per worker")
    if rank is None:
        found = rank_from_env()
        if found is None:
            raise ValueError("no rank: pass rank= or set one of $" + ", $".join(syncopate.RANK_VARIABLES))
        rank = found[0]
    if not 0 <= rank < proto.workers:
        raise ValueError(f"rank {rank} is not below the protocol's {proto.workers} workers")
    host = rank == 0 if server is None else server
    if optimizer is None and proto.name in ROUND_PROTOCOLS and server is not False:
        optimizer = syncopate.Optimizer("mean")
    if server is False and address is None and _launcher_store_port():
        raise ValueError("server=False under torchrun: $MASTER_PORT is torchrun's own store; pass address= "
                         "(HOST:PORT of the server started apart)")
    store = _launcher_store(address) if server is not False else None
    if address is None and store is None:
        address = server_address_from_env()
        if address is None:
            raise ValueError("no server address: pass address= ('HOST:PORT') or set $MASTER_ADDR and $MASTER_PORT")
    if store is not None:
        address = f"{os.environ['MASTER_ADDR']}:0"
    serve_options: dict[str, Any] = dict(updates=updates if updates is not None else 2**62, lost_after_s=lost_after_s)
    if time_limit_s is not None:
        serve_options["time_limit_s"] = time_limit_s
    if log is not None:
        serve_options["log"] = log
    if wire is not None:
        serve_options["wire"] = wire
    for name, value in (("step_timeout_s", step_timeout_s), ("connect_timeout_s", connect_timeout_s)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")
    _current = Session(proto, rank, proto.workers, address, host, optimizer, store, serve_options, secret_file, log,
                       give_up_after_s, step_timeout_s, connect_timeout_s)
    _current.server_apart = server is False
    return _current


def shutdown(timeout_s: float = 60.0) -> Optional[dict[str, Any]]:
    """Leaves the run. On the host (rank 0), waits up to ``timeout_s`` for the other workers to
    leave, stops the server, loads the server's final model into the model when the server
    runs the optimizer, and returns the server's report (``None`` elsewhere). Called at exit
    if the script does not."""
    global _current
    session, _current = _current, None
    if session is None:
        return None
    return session.close(timeout_s)


def rank() -> int:
    """This process's rank (worker id)."""
    return current().rank


def world_size() -> int:
    """The number of workers."""
    return current().world


atexit.register(shutdown)
