from typing import Any, Callable, Optional

import numpy as np

from ._native import (
    PROTOCOLS as PROTOCOLS,
    Optimizer as Optimizer,
    Protocol as Protocol,
    RejectedError as RejectedError,
    Server as Server,
    Worker as Worker,
    WorkerError as WorkerError,
    compare as compare,
    serve as serve,
)

RANK_VARIABLES: tuple[str, ...]
WORLD_SIZE_VARIABLES: tuple[str, ...]

def worker_id_from_env() -> int: ...
def run_worker(
    connect: Optional[str],
    compute: Callable[[np.ndarray[Any, Any], np.ndarray[Any, Any]], float],
    id: Optional[int] = None,
    secret_file: Optional[str] = None,
    **options: Any,
) -> dict[str, Any]: ...
def load_digits(seed: int = 1) -> dict[str, np.ndarray[Any, Any]]: ...
def load_mnist5k(seed: int = 1) -> dict[str, np.ndarray[Any, Any]]: ...
