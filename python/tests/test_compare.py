"""The simulator's compare, as a dict."""

from __future__ import annotations

import pytest

import syncopate

SCENARIO = """
name = "two protocols, one slow worker"
seed = 3
seeds = 1
workers = 4
model = "softmax"
batch_size = 32
learning_rate = 0.5
target_accuracy = 0.85
step_ms = 10.0
max_time_s = 3.0
eval_interval_ms = 20.0

[[stragglers]]
workers = "0"
model = "slow=4"

[[protocols]]
name = "bsp"
[[protocols]]
name = "asp"
"""


def test_compare_returns_one_row_per_protocol() -> None:
    result = syncopate.compare(text=SCENARIO, jobs=2)
    assert result["scenario"] == "two protocols, one slow worker"
    assert result["target_accuracy"] == pytest.approx(0.85)
    assert [r["protocol"] for r in result["rows"]] == ["bsp", "asp"]
    for row in result["rows"]:
        assert 0.0 <= row["final_accuracy"] <= 1.0 and row["updates"] > 0
    # Deterministic: the same scenario gives the same rows.
    assert syncopate.compare(text=SCENARIO, jobs=1)["rows"] == result["rows"]


def test_compare_refuses_bad_scenarios() -> None:
    with pytest.raises(ValueError):
        syncopate.compare(text="this is not toml = = =")
    with pytest.raises(ValueError, match="at most one"):
        syncopate.compare("a.toml", text=SCENARIO)
