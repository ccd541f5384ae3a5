"""The balancer interface and a contract every registered balancer must pass."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamlb.balancer import (Balancer, LoadReport, Move, apply_plan, available_balancers, check_plan,
                               get_balancer)

NAMES = sorted(available_balancers())


def test_builtins_and_a_third_party_balancer_are_registered_through_entry_points():
    # conftest installs examples/third_party_balancer as a separate distribution
    assert {"static", "autoflow", "greedy", "hottest-to-coldest"} <= set(NAMES)
    for name in NAMES:
        assert isinstance(get_balancer(name), Balancer)
    assert available_balancers()["hottest-to-coldest"].dist.name == "hottest-to-coldest"


def test_unknown_balancer_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown balancer 'fancy'; valid balancers are .*autoflow.*greedy.*static"):
        get_balancer("fancy")


@st.composite
def reports(draw):
    n = draw(st.integers(1, 8))
    G = draw(st.integers(1, 128))
    owners = draw(hnp.arrays(np.int64, G, elements=st.integers(0, n - 1)))
    load = draw(hnp.arrays(np.float64, G, elements=st.one_of(st.just(0.0), st.floats(0, 1e6))))
    moved = draw(st.sets(st.integers(0, G - 1), max_size=G // 4))
    return LoadReport("op", owners, load, n, recently_moved=frozenset(moved))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None)
@given(report=reports())
def test_contract(name, report):
    bal = get_balancer(name)
    plan = bal.plan(report)
    assert plan == get_balancer(name).plan(report)            # deterministic
    owners = check_plan(report, plan)                           # valid instances, real owners
    assert len(owners) == report.key_groups                     # each group has one owner
    assert ((owners >= 0) & (owners < report.instances)).all()
    moved = {g for m in plan for g in m.key_groups}
    assert len(moved) == sum(len(m.key_groups) for m in plan)  # no group moved twice
    if name != "greedy":
        assert not moved & report.recently_moved               # hysteresis
    after = LoadReport("op", owners, report.group_load, report.instances)
    assert after.instance_load().max() <= report.instance_load().max() + 1e-6   # never worse


@pytest.mark.parametrize("name", NAMES)
def test_empty_and_single_instance_reports(name):
    bal = get_balancer(name)
    assert bal.plan(LoadReport("op", np.zeros(16, np.int64), np.zeros(16), 4)) == []
    assert bal.plan(LoadReport("op", np.zeros(16, np.int64), np.arange(16.0), 1)) == []


def test_autoflow_and_greedy_reach_the_floor_on_a_skewed_table():
    rng = np.random.default_rng(0)
    G, n = 256, 8
    load = rng.zipf(1.5, G).astype(float)
    owners = np.arange(G) * n // G
    report = LoadReport("op", owners, load, n)
    floor = max(load.sum() / n, load.max())
    for name in ("autoflow", "greedy"):
        new = apply_plan(owners, get_balancer(name).plan(report))
        got = np.bincount(new, weights=load, minlength=n).max()
        assert got <= 1.05 * floor, (name, got / floor)


def test_bad_reports_and_moves_are_refused():
    with pytest.raises(ValueError, match="owners name instance 5; valid instances are 0..1"):
        LoadReport("op", np.array([0, 5]), np.array([1.0, 1.0]), 2)
    with pytest.raises(ValueError, match="one entry per key group"):
        LoadReport("op", np.array([0, 1]), np.array([1.0]), 2)
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        LoadReport("op", np.array([0, 1]), np.array([1.0, -1.0]), 2)
    r = LoadReport("op", np.array([0, 1]), np.array([1.0, 1.0]), 2)
    with pytest.raises(ValueError, match="names instance 3; 'op' has instances 0..1"):
        check_plan(r, [Move((0,), 0, 3)])
    with pytest.raises(ValueError, match="key group 9 is outside 0..1"):
        check_plan(r, [Move((9,), 0, 1)])
    with pytest.raises(ValueError, match="key group 1 is on instance 1, not 0"):
        check_plan(r, [Move((1,), 0, 1)])
