"""`syncopate.torch`'s vectors: `parameters_vector` and `load_vector` copy, never alias.

torch is required (see torch_required.py).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from torch_required import require_torch

torch = require_torch()

import syncopate.torch as st


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))


def test_load_vector_copies_the_vector_into_the_parameters() -> None:
    m = model()
    vector = np.arange(11, dtype=np.float32)
    st.load_vector(m, vector)
    np.testing.assert_array_equal(st.parameters_vector(m), np.arange(11, dtype=np.float32))
    # The model does not share the caller's array: changing it later changes nothing.
    vector[:] = -1.0
    np.testing.assert_array_equal(st.parameters_vector(m), np.arange(11, dtype=np.float32))
    for p in m.parameters():
        assert not np.shares_memory(p.detach().numpy(), vector)


def test_load_vector_keeps_a_worker_s_parameters_as_views_of_its_buffer() -> None:
    m = model()
    flat = st.FlatModel(m)
    before = [p.data_ptr() for p in m.parameters()]
    st.load_vector(m, np.full(11, 2.0, dtype=np.float32))
    assert [p.data_ptr() for p in m.parameters()] == before
    np.testing.assert_array_equal(flat.params.numpy(), np.full(11, 2.0, dtype=np.float32))


def test_load_vector_takes_the_read_only_view_serve_hands_evaluate() -> None:
    m = model()
    view = np.asarray(memoryview(np.ones(11, dtype=np.float32)).toreadonly())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it shares a read-only array
        st.load_vector(m, view)
    np.testing.assert_array_equal(st.parameters_vector(m), np.ones(11, dtype=np.float32))
    with pytest.raises(ValueError, match="the vector has 10 elements; the model has 11 parameters"):
        st.load_vector(m, np.zeros(10, dtype=np.float32))
