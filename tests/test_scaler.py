"""The scaler interface and the ds2 policy: pure plans from rate reports."""
import dask.config
import pytest

from balancers.ds2 import DS2Scaler
from streamlb.scaler import Scaler, get_scaler, scaler_names, true_rate

INF = float("inf")


def op(parallelism=2, input_rate=9000.0, true_rate=2000.0, backlog=0.0, since_change=INF, lo=1, hi=64):
    return {"parallelism": parallelism, "min": lo, "max": hi, "input_rate": input_rate, "backlog": backlog,
            "true_rate": true_rate, "since_change": since_change}


def report(**operators):
    return {"time": 100.0, "operators": operators}


def test_ds2_is_registered_through_the_entry_point_group():
    assert "ds2" in scaler_names()
    scaler = get_scaler("ds2")
    assert isinstance(scaler, DS2Scaler) and isinstance(scaler, Scaler)
    assert scaler.name == "ds2"
    assert get_scaler(scaler) is scaler
    assert get_scaler("ds2", target_utilisation=0.5).target_utilisation == 0.5


def test_unknown_scaler_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown scaler 'fancy'; valid scalers are .*ds2"):
        get_scaler("fancy")


def test_true_rate():
    assert true_rate(9000, 4.5) == 2000.0
    assert true_rate(0, 0.0) is None
    assert true_rate(10, -1.0) is None
    assert true_rate(10, float("nan")) is None


def test_defaults_come_from_the_settings():
    s = DS2Scaler()
    assert (s.target_utilisation, s.cooldown, s.catch_up) == (0.7, 5.0, 10.0)
    with dask.config.set({"streamlb.scaler.target-utilisation": 0.5, "streamlb.scaler.cooldown": "2s",
                          "streamlb.scaler.catch-up": "1m"}):
        s = DS2Scaler()
        assert (s.target_utilisation, s.cooldown, s.catch_up) == (0.5, 2.0, 60.0)
        assert DS2Scaler(target_utilisation=0.9, cooldown=0, catch_up="500ms").catch_up == 0.5


@pytest.mark.parametrize("kwargs, bad", [
    ({"target_utilisation": 0}, "target_utilisation"),
    ({"target_utilisation": 1.5}, "target_utilisation"),
    ({"target_utilisation": float("nan")}, "target_utilisation"),
    ({"target_utilisation": "high"}, "target_utilisation"),
    ({"cooldown": -1}, "cooldown"),
    ({"cooldown": "soon"}, "cooldown"),
    ({"catch_up": 0}, "catch_up"),
    ({"catch_up": -2.0}, "catch_up"),
])
def test_bad_options_name_the_option(kwargs, bad):
    with pytest.raises(ValueError, match=rf"ds2: {bad} must be"):
        DS2Scaler(**kwargs)
    with pytest.raises(ValueError, match=rf"ds2: {bad} must be"):
        get_scaler("ds2", **kwargs)


def test_needed_parallelism_from_the_true_rate():
    # 9000 rec/s over 2000 rec/s per instance kept 70% busy: ceil(9000 / 1400) = ceil(6.43) = 7
    assert DS2Scaler().plan(report(totals=op(parallelism=2))) == {"totals": 7}
    # at full utilisation: ceil(9000 / 2000) = 5
    assert DS2Scaler(target_utilisation=1.0).plan(report(totals=op(parallelism=2))) == {"totals": 5}


def test_no_change_is_not_in_the_plan():
    assert DS2Scaler().plan(report(totals=op(parallelism=7))) == {}


def test_exactly_at_target_does_not_round_up():
    # 2450 / (700 * 0.7) is 5 exactly, but 5.000000000000001 in floats
    assert 2450.0 / (700.0 * 0.7) > 5
    assert DS2Scaler().plan(report(a=op(parallelism=5, input_rate=2450.0, true_rate=700.0))) == {}
    assert DS2Scaler().plan(report(a=op(parallelism=4, input_rate=2450.0, true_rate=700.0))) == {"a": 5}


def test_clamped_to_min_and_max():
    s = DS2Scaler()
    assert s.plan(report(a=op(parallelism=2, hi=5))) == {"a": 5}            # needs 7
    assert s.plan(report(a=op(parallelism=5, hi=5))) == {}
    assert s.plan(report(a=op(parallelism=4, input_rate=100.0, lo=2))) == {"a": 2}   # needs 1
    assert s.plan(report(a=op(parallelism=2, input_rate=0.0, lo=2))) == {}
    assert s.plan(report(a=op(parallelism=3, input_rate=0.0))) == {"a": 1}
    assert s.plan(report(a=op(parallelism=9, input_rate=INF, hi=12))) == {"a": 12}


def test_scale_in_after_the_rate_drops():
    # 4000 rec/s: ceil(4000 / 1400) = ceil(2.86) = 3
    assert DS2Scaler().plan(report(a=op(parallelism=7, input_rate=4000.0))) == {"a": 3}


def test_backlog_is_worked_off_within_catch_up():
    # 9000 + 14000 / 10 = 10400 rec/s: ceil(10400 / 1400) = ceil(7.43) = 8
    assert DS2Scaler().plan(report(a=op(parallelism=2, backlog=14000.0))) == {"a": 8}
    # within 2 s instead: 9000 + 7000 = 16000: ceil(16000 / 1400) = ceil(11.43) = 12
    assert DS2Scaler(catch_up=2).plan(report(a=op(parallelism=2, backlog=14000.0))) == {"a": 12}
    assert DS2Scaler().plan(report(a=op(parallelism=2, backlog=None))) == {"a": 7}


def test_cooldown_is_respected():
    s = DS2Scaler(cooldown=5)
    assert s.plan(report(a=op(since_change=4.9))) == {}
    assert s.plan(report(a=op(since_change=5.0))) == {"a": 7}
    assert s.plan(report(a=op(since_change=INF))) == {"a": 7}
    assert DS2Scaler(cooldown=0).plan(report(a=op(since_change=0.0))) == {"a": 7}


@pytest.mark.parametrize("rate", [None, float("nan"), 0.0, -5.0])
def test_unknown_true_rate_is_skipped(rate):
    # the other operator is still judged: ceil(4000 / 1400) = 3
    assert DS2Scaler().plan(report(a=op(true_rate=rate), b=op(parallelism=2, input_rate=4000.0))) == {"b": 3}
    assert DS2Scaler().plan(report(a=op(true_rate=rate))) == {}


@pytest.mark.parametrize("rate", [None, float("nan")])
def test_unknown_input_rate_is_skipped(rate):
    assert DS2Scaler().plan(report(a=op(input_rate=rate))) == {}


def test_plan_is_sorted_by_operator_and_deterministic():
    r = report(zeta=op(), alpha=op(input_rate=4000.0), mid=op(parallelism=7))
    s = DS2Scaler()
    plan = s.plan(r)
    assert list(plan) == ["alpha", "zeta"] and plan == {"alpha": 3, "zeta": 7}
    assert s.plan(r) == plan
    assert all(type(v) is int for v in plan.values())


def test_malformed_reports_name_the_operator_and_field():
    s = DS2Scaler()
    with pytest.raises(ValueError, match=r"operator 'a' has min 5 and max 2"):
        s.plan(report(a=op(lo=5, hi=2)))
    with pytest.raises(ValueError, match=r"operator 'a': 'parallelism' must be an integer >= 1"):
        s.plan(report(a=op(parallelism=0)))
    with pytest.raises(ValueError, match=r"operator 'a': 'input_rate' must be >= 0"):
        s.plan(report(a=op(input_rate=-1.0)))
    with pytest.raises(ValueError, match=r"'operators' dict"):
        s.plan({"time": 0.0})


def test_a_step_in_input_is_caught_up_within_two_decisions():
    """Each instance processes 2000 rec/s; the offered rate steps from 2000 to 12000 rec/s."""
    per_instance, window, step_at = 2000.0, 1.0, 3
    scaler = DS2Scaler(target_utilisation=0.7, cooldown=5, catch_up=10)
    p, backlog, since = 2, 0.0, INF            # ceil(2000 / 1400) = 2 keeps up before the step
    changes, decisions_to_keep_up = [], None
    for w in range(30):
        offered = 2000.0 if w < step_at else 12000.0
        work = backlog + offered * window
        processed = min(work, p * per_instance * window)
        backlog = work - processed
        busy = processed / p / per_instance      # seconds each instance was busy
        since += window
        name = "totals"
        plan = scaler.plan({"time": w * window, "operators": {name: {
            "parallelism": p, "min": 1, "max": 32, "input_rate": offered, "backlog": backlog,
            "true_rate": true_rate(processed / p, busy), "since_change": since}}})
        if plan:
            p, since = plan[name], 0.0
            changes.append((w, p))
        if w >= step_at and decisions_to_keep_up is None and p * per_instance >= offered:
            decisions_to_keep_up = len(changes)
    # window 3: backlog 12000 - 4000 = 8000, so ceil((12000 + 8000 / 10) / 1400) = ceil(9.14) = 10;
    # window 4 works the backlog off (capacity 20000 = 8000 + 12000); after the 5 s cooldown,
    # ceil(12000 / 1400) = ceil(8.57) = 9, which keeps up (18000 >= 12000) and stays
    assert decisions_to_keep_up is not None and decisions_to_keep_up <= 2
    assert changes == [(3, 10), (8, 9)]
    assert p == 9 and backlog == 0.0
