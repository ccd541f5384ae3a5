"""Zipf keys drawn through the cached CDF and its guide: the same keys as a plain search of
the CDF, whatever the batch a row id arrives in (numpy only, no Spark)."""
import numpy as np
import pytest

from streamlb.datasets import _zipf


def _plain_keys(ids, keys, skew, drift_every, seed):
    """The keys as the generator first drew them: a CDF and a permutation per call."""
    cdf = _zipf._zipf_cdf(keys, skew)
    u = _zipf._blocks(ids, seed, 1, lambda r, n: {"u": r.random(n)})["u"]
    ranks = np.minimum(np.searchsorted(cdf, u, side="right"), keys - 1)
    if drift_every:
        ranks = (ranks + (ids // drift_every) * (keys // 3 + 7)) % keys
    return np.random.default_rng([seed, 0]).permutation(keys)[ranks].astype(np.int64)


@pytest.mark.parametrize("keys", [1, 2, 3, 7, 1000, 65_537, 300_001])
@pytest.mark.parametrize("skew", [0.0, 0.7, 1.2, 3.0])
def test_guided_ranks_equal_a_plain_search_of_the_cdf(keys, skew):
    cdf = _zipf._zipf_cdf(keys, skew)
    inner = cdf[cdf < 1]
    # random draws, and draws exactly on and just below every CDF entry (the ties)
    u = np.concatenate([np.random.default_rng(keys).random(20_000), inner[:50_000],
                        np.nextafter(inner[:50_000], 0), [0.0, np.nextafter(1.0, 0)]])
    want = np.minimum(np.searchsorted(cdf, u, side="right"), keys - 1)
    np.testing.assert_array_equal(_zipf._zipf_ranks(u, keys, skew), want)


@pytest.mark.parametrize("drift_every", [None, 7_001])
def test_zipf_keys_are_the_plain_keys_in_any_batches(drift_every):
    ids = np.arange(3_000, 200_000)
    want = _plain_keys(ids, 50_000, 1.1, drift_every, 4)
    np.testing.assert_array_equal(_zipf.zipf_keys(ids, 50_000, 1.1, drift_every, 4), want)
    cuts = [0, 1, 10_000, 65_533, 131_075, len(ids)]            # across RNG blocks, uneven
    got = [_zipf.zipf_keys(ids[a:b], 50_000, 1.1, drift_every, 4) for a, b in zip(cuts, cuts[1:])]
    np.testing.assert_array_equal(np.concatenate(got), want)


def test_cached_tables_are_read_only():
    cdf, guide = _zipf._zipf_table(1000, 1.0)
    perm = _zipf._key_permutation(1000, 0)
    for a in (cdf, guide, perm):
        assert not a.flags.writeable
    assert sorted(perm) == list(range(1000))
