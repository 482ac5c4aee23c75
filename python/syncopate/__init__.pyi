from typing import Any

import numpy as np

from ._native import (
    PROTOCOLS as PROTOCOLS,
    Protocol as Protocol,
    RejectedError as RejectedError,
    Server as Server,
    Worker as Worker,
    WorkerError as WorkerError,
    compare as compare,
    run_worker as run_worker,
)

def load_digits(seed: int = 1) -> dict[str, np.ndarray[Any, Any]]: ...
