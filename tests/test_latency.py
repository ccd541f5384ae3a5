"""Latency histograms against numpy over the same latencies."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamlb import latency


@settings(max_examples=100, deadline=None)
@given(lat=hnp.arrays(np.float64, st.integers(1, 400), elements=st.floats(0.3, 60_000)),
       weights=st.data(), q=st.sampled_from([0.5, 0.9, 0.99, 1.0]))
def test_quantile_of_a_histogram_is_within_a_bin_of_the_exact_one(lat, weights, q):
    w = weights.draw(hnp.arrays(np.int64, len(lat), elements=st.integers(1, 50)))
    h = latency.histogram(lat, w)
    assert h.sum() == w.sum()
    exact = np.sort(np.repeat(lat, w))[int(np.ceil(q * w.sum())) - 1]      # the record at rank q
    got = latency.quantile(h, q)
    step = 2 ** 0.25                                                       # one bin's width
    assert exact / step <= got <= exact * step


def test_histograms_add_up_across_windows():
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(3, 1, 5000), rng.lognormal(5, 0.5, 500)
    both = latency.histogram(a) + latency.histogram(b)
    np.testing.assert_array_equal(both, latency.histogram(np.concatenate([a, b])))
    assert latency.quantile(both, 0.99) == pytest.approx(np.quantile(np.concatenate([a, b]), 0.99), rel=0.19)


def test_edge_cases_and_bad_input():
    assert np.isnan(latency.quantile(np.zeros(latency.BINS), 0.99))
    h = latency.histogram([-3.0, 10 ** 9])        # clock skew, and past the last edge
    assert h[0] == 1 and h[-1] == 1
    with pytest.raises(ValueError, match=f"a latency histogram has {latency.BINS} bins"):
        latency.quantile([1, 2, 3], 0.5)
    with pytest.raises(ValueError, match="quantile q must lie in 0..1, got 99"):
        latency.quantile(h, 99)
