"""torch for the tests that need it: without torch they fail, unless $SYNCOPATE_NO_TORCH=1 says
torch is not expected here (then they are skipped)."""

from __future__ import annotations

import os
import types

import pytest


def require_torch() -> types.ModuleType:
    """The torch module; a module-level skip under $SYNCOPATE_NO_TORCH=1; a missing torch is a failure."""
    if os.environ.get("SYNCOPATE_NO_TORCH") == "1":
        pytest.skip("$SYNCOPATE_NO_TORCH=1: torch is not expected here", allow_module_level=True)
    try:
        import torch
    except ImportError as e:  # a missing torch is a failure, not a skip
        raise RuntimeError(f"torch is required by these tests ({e}); set SYNCOPATE_NO_TORCH=1 to skip them") from e
    return torch
