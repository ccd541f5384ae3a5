"""The balancer plugin refuses malformed commands, and the job it runs goes on, exact.

One job runs on two worker processes while hypothesis sends the plugin commands that are
each wrong in one way (an unknown job or operator, a wrong type, a value out of range, a
missing or an unexpected argument, a garbled table or topology) and load reports that are
malformed. Every command is answered with a CommandError naming what was wrong; nothing
the plugin holds of the job changes; afterwards a valid move still works and the job's
state is exactly pandas'.
"""
import functools
import time
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamz import Stream

import streamlb
from streamlb._migration._epochs import STRATEGIES
from streamlb._migration._commands import show
from streamlb.balancer import available_balancers
from streamlb.keygroups import assign_to_key_group
from streamlb.plugin import NAME

AGG = {"n": ("value", "count"), "total": ("value", "sum")}
G, N = 64, 3                        # key groups, instances of "agg"
ROWS, RATE = 120_000, 12_000        # about 10 s of stream: the commands (2-3 s) are sent while it runs
# the source watches its directory, so the job runs until the test drains it, however slow the machine
RESERVED = {"op", "reply", "close", "serializers"}      # taken by distributed's RPC itself

# values of every type a message can carry
junk = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), st.floats(allow_nan=True),
    st.text(max_size=12), st.binary(max_size=8),
    st.lists(st.integers(-5, 5), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(-5, 5), max_size=2),
)
names = st.text(min_size=1, max_size=12)
out_of_range = st.one_of(st.integers(-(2 ** 40), -1), st.integers(N, 2 ** 40))
not_number = st.one_of(st.none(), st.booleans(), st.text(max_size=5), st.lists(st.integers(-5, 5), max_size=2),
                       st.sampled_from([float("nan"), float("inf"), -float("inf")]))
not_int = st.one_of(not_number, st.floats())


def not_a(*types):
    """Junk that is none of ``types`` (a bool is no int)."""
    return junk.filter(lambda v: bool not in types if isinstance(v, bool) else not isinstance(v, types))


def plugin_view(dask_scheduler, job):
    """What the plugin holds of ``job`` that a refused command must leave alone."""
    p = dask_scheduler.plugins[NAME]
    j = p.jobs[job]
    ops = {name: (op.table.epoch, op.table.owners.tolist(), op.table.splits, op.in_flight, op.reconfiguring,
                  op.lock.locked()) for name, op in j.control.operators.items()}
    return sorted(p.jobs), ops, len(j.control.history), j.autoscale, j.balancer_name, j.migration


def last_refusal(dask_scheduler, job, msg):
    """Feed ``msg`` to the scheduler's ``streamlb-load`` stream handler; the refusal recorded."""
    p = dask_scheduler.plugins[NAME]
    before = len(p.jobs[job].refused) + len(p.refused)
    dask_scheduler.stream_handlers["streamlb-load"](worker="tcp://test", **msg)
    refused = p.jobs[job].refused + p.refused
    return None if len(refused) == before else max(refused, key=lambda r: r["time"])["reason"]


@st.composite
def mutated(draw, base: dict, required: set, bad: dict):
    """``base`` (a valid call) wrong in one way: one argument given a value from
    ``bad[arg]``, a required one left out, or one added. Returns (arguments, the argument
    the error must name, which of the three)."""
    how = draw(st.sampled_from(["bad"] * 4 + ["missing", "extra"]))
    if how == "extra":
        bad = {}
    args = dict(base)
    if how == "missing" and required:
        arg = draw(st.sampled_from(sorted(required)))
        del args[arg]
        return args, arg, how
    if bad:
        arg = draw(st.sampled_from(sorted(bad)))
        args[arg] = draw(bad[arg])
        return args, arg, "bad"
    arg = draw(names.filter(lambda a: a not in base and a not in RESERVED))
    args[arg] = draw(junk)
    return args, arg, "extra"


def bad_topologies(topology: dict, registered: bool):
    """Topologies wrong in one way, for a job registered (an update) or not."""
    op = "agg"
    spec = topology["operators"][op]

    def with_op(**change):
        return {**topology, "operators": {op: {**spec, **change}}}

    return st.one_of(
        not_a(dict),
        st.sampled_from(sorted(topology)).map(lambda k: {t: v for t, v in topology.items() if t != k}),
        st.just({**topology, "extra": 1}), st.just({**topology, "job": "someone-else"}),
        st.integers(1, 2 ** 20).filter(lambda g: g != G).map(lambda g: {**topology, "key_groups": g}),
        st.just({**topology, "key_groups": 0}), st.just({**topology, "reset": "yes"}),
        not_a(list).map(lambda s: {**topology, "sources": s}), st.just({**topology, "instances": [[1, 2]]}),
        st.just({**topology, "operators": [spec]}),
        st.just(with_op(owners=spec["owners"][:1])), st.just(with_op(owners=[])), st.just(with_op(routers="r")),
        st.just(with_op(table=spec["table"][:3])), not_int.map(lambda e: with_op(epoch=e)),
        st.just({**with_op(table=[N] * G), "reset": True}),
        st.just({**topology, "operators": {op: {k: v for k, v in spec.items() if k != "stage"}}}),
        *([st.just({**topology, "operators": {"nope": spec}})] if registered else []))


def bad_arguments(job: str, topology: dict, table: dict, home_of_5: int) -> dict:
    """Argument -> values of it each wrong in one way."""
    op = "agg"
    ops = st.one_of(names.filter(lambda s: s != op), not_a(str))
    pairs = st.one_of(
        st.tuples(st.integers(-(2 ** 40), -1) | st.integers(G, 2 ** 40), st.integers(0, N - 1)),
        st.tuples(st.integers(0, G - 1), out_of_range),
        st.tuples(not_int, st.integers(0, N - 1)), st.tuples(st.integers(0, G - 1), not_int),
    ).map(list)
    helper = (home_of_5 + 1) % N
    owners = table["owners"]
    return {
        "job": st.one_of(names.filter(lambda s: s != job), not_a(str)),
        "operator": ops,
        "operators": st.one_of(not_a(list), st.lists(ops, min_size=1, max_size=3).map(lambda xs: [op] + xs),
                               st.just([op, op])),
        "assignment": st.one_of(
            not_a(list), st.lists(pairs, min_size=1, max_size=3).map(lambda ps: [[1, 1]] + ps),
            st.lists(st.integers(0, 3), max_size=3).map(lambda p: [p] if len(p) != 2 else [p, p, p]),
            st.just([[2, 1], [2, 0]])),
        "strategy": st.one_of(names.filter(lambda s: s not in STRATEGIES), not_a(str).filter(lambda v: v is not None)),
        "reconfig": not_a(bool),
        "timeout": st.one_of(not_a(int, float), st.floats(max_value=0.0), st.just(float("nan")),
                             st.just(float("inf"))),
        "changes": st.one_of(
            not_a(list), st.just([[5, [home_of_5]]]), st.just([[5, [helper, helper]]]),
            out_of_range.map(lambda h: [[5, [h]]]),
            st.one_of(st.none(), st.floats(), st.lists(st.integers(), max_size=2), st.binary(max_size=3)).map(
                lambda k: [[k, [helper]]]),
            st.just([[5, [helper]], [5, []]]), st.just([[5, helper]]), st.just([[5]])),
        "table": st.one_of(
            not_a(dict), st.just({"owners": owners}), st.just({"epoch": 0}), st.just({**table, "nope": 1}),
            st.just({**table, "owners": owners[:-1]}), st.just({**table, "owners": owners + [0]}),
            st.one_of(out_of_range, not_int).map(lambda i: {**table, "owners": [i] + owners[1:]}),
            st.one_of(st.integers(-(2 ** 40), -1), not_int).map(lambda e: {**table, "epoch": e}),
            st.just({**table, "splits": [[5, []]]}), st.just({**table, "splits": [[5.5, [1]]]}),
            st.just({**table, "splits": "x"}), out_of_range.map(lambda h: {**table, "splits": [[5, [h]]]})),
        "topology": bad_topologies(topology, registered=True),
        "decision": st.one_of(not_a(dict), st.just({1: "x"}), not_number.map(lambda t: {"started": t}),
                              not_a(str).map(lambda s: {"status": s})),
        "wanted": st.one_of(not_a(dict), st.integers(-5, 0).map(lambda p: {op: p}), not_int.map(lambda p: {op: p}),
                            st.just({1: 2})),
    }


def commands(job: str, topology: dict, table: dict, home_of_5: int):
    """Strategy of (handler, arguments, the argument its error must name, how it is wrong)."""
    op = "agg"
    bad = bad_arguments(job, topology, table, home_of_5)
    fresh = "fresh-job"
    register = {
        "job": st.one_of(st.just(job), not_a(str)),     # registered already, or no id
        "topology": bad_topologies({**topology, "job": fresh}, registered=False),
        "balancer": st.one_of(names.filter(lambda s: s not in available_balancers()),
                              not_a(str).filter(lambda v: v is not None)),
        "options": st.one_of(not_a(dict).filter(lambda v: v is not None), st.just({"nope": 1})),
        "migration": bad["strategy"],
    }
    with_op = {"job": job, "operator": op}
    calls = {   # handler: (a valid call, its required arguments)
        "streamlb_register_job": ({"job": fresh, "topology": {**topology, "job": fresh}, "balancer": "static",
                                   "options": {}, "migration": "fluid"}, {"job", "topology"}),
        "streamlb_unregister_job": ({"job": job}, {"job"}),
        "streamlb_migrate": ({**with_op, "assignment": [[0, 1]], "strategy": "all-at-once", "reconfig": False},
                             {"job", "operator", "assignment"}),
        "streamlb_split": ({**with_op, "changes": [[5, [(home_of_5 + 1) % N]]]}, {"job", "operator", "changes"}),
        "streamlb_routing": (with_op, {"job", "operator"}),
        "streamlb_trace": (with_op, {"job", "operator"}),
        "streamlb_history": ({"job": job}, {"job"}),
        "streamlb_state": ({}, set()),
        "streamlb_hold": ({"job": job, "operators": [op]}, {"job", "operators"}),
        "streamlb_release": ({"job": job, "operators": [op]}, {"job", "operators"}),
        "streamlb_resume": ({"job": job, "operators": [op]}, {"job", "operators"}),
        "streamlb_pause": ({"job": job, "operators": [op], "timeout": 1.0}, {"job", "operators", "timeout"}),
        "streamlb_topology": ({"job": job, "topology": topology}, {"job", "topology"}),
        "streamlb_set_table": ({**with_op, "table": table}, {"job", "operator", "table"}),
        "streamlb_autoscale": ({"job": job, "decision": {"operator": op, "status": "done", "started": 1.0},
                                "wanted": {}}, {"job", "decision", "wanted"}),
    }

    def one(handler):
        base, required = calls[handler]
        wrong = register if handler == "streamlb_register_job" else {a: bad[a] for a in base}
        return mutated(base, required, wrong).map(lambda m: (handler, *m))

    return st.sampled_from(sorted(calls)).flatmap(one)


def load_reports(job: str):
    """Load reports each malformed in one field; (message, the field the refusal names)."""
    base = {"job": job, "operator": "agg", "instance": 0, "window_start": time.time(), "kind": "owner",
            "records": 1, "busy": 0.1, "queued": 0}
    bad = {
        "job": not_a(str).filter(lambda v: v is not None), "operator": st.one_of(not_a(str), names.filter(
            lambda s: s != "agg")),
        "instance": st.one_of(not_int, out_of_range), "window_start": st.one_of(
            st.sampled_from([float("nan"), float("inf"), -float("inf")]), not_a(int, float)),
        "records": st.one_of(st.integers(-(2 ** 40), -1), not_int.filter(lambda v: v is not None)),
        "busy": st.one_of(st.floats(max_value=-1e-9), st.just(float("nan")), st.text(max_size=3)),
        "kind": names.filter(lambda s: s not in ("owner", "router")),
    }
    gone = st.sampled_from(["job", "operator", "instance", "window_start"]).map(
        lambda f: ({k: v for k, v in base.items() if k != f}, f))
    one = st.sampled_from(sorted(bad)).flatmap(lambda f: bad[f].map(lambda v: ({**base, f: v}, f)))
    return st.one_of(one, gone)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"key": rng.integers(0, 2000, ROWS).astype(np.int64),
                       "value": rng.integers(0, 1000, ROWS).astype(float)})
    path = tmp_path_factory.mktemp("commands")
    for p in range(2):
        df.iloc[p::2].to_parquet(path / f"part-{p}.parquet", index=False)
    return str(path), df


@pytest.mark.timeout(300)
def test_malformed_commands_are_refused_and_the_job_stays_exact(source):
    from distributed import Client, LocalCluster

    from streamlb.exceptions import CommandError

    path, df = source
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
            Client(cl) as client:
        src = Stream.from_parquet(path, batch_size=2_000, rate=RATE, watch="1s")
        src.key_by("key").aggregate(AGG, parallelism=N, name="agg")
        with streamlb.run(src, client=client, key_groups=G, window="250ms", balancer="static") as job:
            jid = job.id
            before = client.run_on_scheduler(plugin_view, job=jid)
            table = {"owners": before[1]["agg"][1], "epoch": before[1]["agg"][0], "splits": []}
            group_of_5 = int(assign_to_key_group(np.array([5]), G)[0])
            home_of_5 = table["owners"][group_of_5]
            windows = len(job.balancer_state()["operators"]["agg"]["imbalance"])
            sent = {"commands": 0, "reports": 0}
            kinds = Counter()       # (handler, how it was wrong) of the commands sent
            quick = {"deadline": None, "database": None,
                     "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much]}

            @settings(max_examples=200, **quick)
            @given(case=commands(jid, job.topology(), table, home_of_5))
            def refused(case):
                handler, args, arg, how = case
                kinds[handler, how] += 1
                with pytest.raises(CommandError) as err:
                    # the arguments bound first: an extra one may be named as sync's own ("func")
                    client.sync(functools.partial(getattr(client.scheduler, handler), **args), callback_timeout=10)
                message = str(err.value)
                assert message.startswith(f"{handler}: ") and repr(arg) in message, (handler, args, message)
                if how == "bad" and isinstance(args[arg], str):     # an unknown name: shown as given
                    assert show(args[arg]) in message, (handler, args, message)
                assert client.run_on_scheduler(plugin_view, job=jid) == before, (handler, args)
                sent["commands"] += 1

            @settings(max_examples=100, **quick)
            @given(case=load_reports(jid))
            def dropped(case):
                msg, field = case
                reason = client.run_on_scheduler(last_refusal, job=jid, msg=msg)
                assert reason is not None and "malformed load report" in reason and field in reason, (msg, reason)
                assert client.run_on_scheduler(plugin_view, job=jid) == before, msg
                sent["reports"] += 1

            t0 = time.time()
            refused()
            dropped()
            took = time.time() - t0
            assert sent["commands"] >= 200 and sent["reports"] >= 100, sent
            with pytest.raises(TimeoutError):     # the job still runs
                job.wait(timeout=0)
            print(f"\n{sent['commands']} malformed commands and {sent['reports']} load reports refused "
                  f"in {took:.1f} s while job {jid} ran; {len({h for h, _ in kinds})} handlers: {dict(kinds)}")

            # the plugin's loop goes on: load still merged, a valid move and a routing query work
            time.sleep(1.0)
            assert len(job.balancer_state()["operators"]["agg"]["imbalance"]) > windows
            mine = [g for g in range(G) if table["owners"][g] == 0 and g != group_of_5][:4]
            moved = job.migrate("agg", mine, 2, strategy="all-at-once")
            assert moved.epoch == table["epoch"] + 1 and set(moved.owners[mine].tolist()) == {2}
            assert job.routing("agg").owners.tolist() == moved.owners.tolist()
            # what the autoscaler records of a failed step (no operator) is a valid decision
            client.sync(client.scheduler.streamlb_autoscale, job=jid, callback_timeout=10,
                        decision={"operator": None, "status": "failed", "reason": "test"}, wanted={})
            helper = (home_of_5 + 1) % N    # key 5 split over a helper and merged back
            assert job.split("agg", 5, [helper]).splits == ((5, (helper,)),)
            assert job.split("agg", 5, []).splits == ()
            deadline = time.time() + 120
            while job.state("agg")["n"].sum() < ROWS and time.time() < deadline:
                time.sleep(0.5)     # every row read, then the watching source is drained
            job.drain(timeout=120)
            pd.testing.assert_frame_equal(job.state("agg"), df.groupby("key").agg(**AGG), check_dtype=False)


def test_split_keys_of_every_type_the_hash_takes_are_accepted():
    """Integers, strings and booleans (``Job.split`` takes keys of a bool-keyed aggregate);
    anything else is refused by name."""
    from streamlb._migration._commands import Call, _split_key
    from streamlb._migration._control import OperatorControl
    from streamlb.exceptions import CommandError
    from streamlb.routing import RoutingTable

    call = Call(None, "streamlb_split")
    call.op = OperatorControl("agg", [["w", "a"]], [["w", "r"]], RoutingTable.initial(G, 1))
    for key in (5, np.int64(5), "k", True, np.bool_(False)):
        expect = int(assign_to_key_group(np.asarray([key]), G)[0])
        assert _split_key(call, "changes", key) == expect
    for bad in (1.5, None, b"x", [1]):
        with pytest.raises(CommandError, match="changes"):
            _split_key(call, "changes", bad)
