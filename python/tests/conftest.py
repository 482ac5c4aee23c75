"""Shared fixtures: the repository root and the `syncopate` CLI binary."""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def syncopate_bin() -> pathlib.Path:
    """The CLI binary: $SYNCOPATE_BIN, else target/debug/syncopate (`cargo build --bin syncopate`)."""
    path = pathlib.Path(os.environ.get("SYNCOPATE_BIN", ROOT / "target" / "debug" / "syncopate"))
    if not path.exists():
        pytest.fail(f"{path} does not exist: run `cargo build --bin syncopate` first or set SYNCOPATE_BIN")
    return path
