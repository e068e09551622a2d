"""The detector's fast medians give what the plain per-element definitions give, bit for bit: a
different rounding could flip a threshold and change a flag."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from anomaly.robust import leave_one_out_median, row_medians

values = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.just(np.nan), st.sampled_from([0.0, 0.5, 1.0]))


def naive_leave_one_out(row: np.ndarray) -> np.ndarray:
    out = np.full(len(row), np.nan)
    for i in range(len(row)):
        others = np.delete(row, i)
        if np.isfinite(others).any():
            out[i] = np.nanmedian(others)
    return out


@settings(max_examples=400, deadline=None)
@given(arrays(np.float64, st.integers(1, 16), elements=values))
def test_leave_one_out_median_is_each_elements_median_of_the_others(row: np.ndarray) -> None:
    np.testing.assert_array_equal(leave_one_out_median(row), naive_leave_one_out(row))


def test_leave_one_out_median_of_many_is_the_plain_median() -> None:
    row = np.arange(40.0)
    np.testing.assert_array_equal(leave_one_out_median(row), np.full(40, 19.5))


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 20), st.integers(1, 8)), elements=values))
def test_row_medians_are_numpys_nan_aware_medians(window: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(row_medians(window), np.nanmedian(window, axis=1))
