"""The commands the balancer plugin answers, checked before they run.

Every RPC handler of :class:`~streamlb.plugin.BalancerPlugin` is declared with
:func:`command`: its name on the scheduler and one checker per argument, in the order they
are checked (the job before its operator, the operator before its key groups). A call is
checked whole before the handler runs: no argument missing, none unexpected, each of the
right type and in range for the job and operator it names. A command that does not pass
changes nothing; it is answered with a :class:`~streamlb.exceptions.CommandError` naming the
command, the argument and what would be valid, logged in one line and recorded in the
plugin's ``refused``.

Load reports (stream op ``streamlb-load``) are checked by :func:`check_load`; the plugin
drops and logs one that does not pass, since a stream handler that raises breaks the
worker's stream.
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
import reprlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from distributed.core import error_message

from ..balancer import available_balancers, get_balancer
from ..exceptions import CommandError, MigrationError
from ..keygroups import check_key_groups
from ._control import JobControl, OperatorControl, table_from_state
from ._epochs import STRATEGIES
from ..keygroups import key_group_of

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 80
_short.maxlist = _short.maxtuple = _short.maxdict = 6
_short.maxlevel = 3


def show(value) -> str:
    """A repr of ``value`` short enough for an error message."""
    return _short.repr(value)


class Call:
    """One command being checked: its name, and what its checkers found so far."""

    def __init__(self, plugin, name: str) -> None:
        self.plugin = plugin
        self.name = name
        self.job_id: str | None = None
        self.job = None                         # the plugin's record of the job named
        self.op: OperatorControl | None = None  # the keyed operator named
        self.balancer: str | None = None

    def refuse(self, arg: str, problem: str) -> CommandError:
        return CommandError(f"{self.name}: argument {arg!r}: {problem}")

    @property
    def control(self) -> JobControl:
        return self.job.control


Checker = Callable[[Call, str, object], object]


class Default(NamedTuple):
    """An argument that may be left out: ``default`` is then checked in its place."""
    check: Checker
    default: object = None


def command(name: str, **arguments: Checker | Default):
    """Register the decorated plugin method as RPC handler ``name``, its arguments checked
    by ``arguments`` (checker per argument, in order) before it runs.

    A refused call is answered with the :class:`CommandError` (raised at the caller) and
    logged as one line (the scheduler would log a traceback for an exception raised).
    """
    takes = ", ".join(a if not isinstance(c, Default) else f"{a}={c.default!r}" for a, c in arguments.items())

    def checked(plugin, given: dict) -> tuple[dict | None, dict | None]:
        call = Call(plugin, name)
        try:
            return _check(call, arguments, given, takes), None
        except CommandError as exc:
            return None, _answer(call, exc)

    def decorate(method):
        if inspect.iscoroutinefunction(method):
            @functools.wraps(method)
            async def handler(self, **given):
                kwargs, refused = checked(self, given)
                return refused if kwargs is None else await method(self, **kwargs)
        else:
            @functools.wraps(method)
            def handler(self, **given):
                kwargs, refused = checked(self, given)
                return refused if kwargs is None else method(self, **kwargs)
        handler.command = name
        return handler

    return decorate


def handlers(plugin) -> dict[str, Callable]:
    """RPC name -> bound handler, for every method of ``plugin`` declared with :func:`command`."""
    out = {}
    for attr in dir(type(plugin)):
        name = getattr(getattr(type(plugin), attr), "command", None)
        if name is not None:
            out[name] = getattr(plugin, attr)
    return out


def _check(call: Call, arguments: dict, given: dict, takes: str) -> dict:
    extra = [a for a in given if a not in arguments]
    if extra:
        raise CommandError(f"{call.name}: unexpected argument {extra[0]!r}; {call.name} takes ({takes})")
    missing = [a for a, c in arguments.items() if not isinstance(c, Default) and a not in given]
    if missing:
        raise CommandError(f"{call.name}: missing argument {missing[0]!r}; {call.name} takes ({takes})")
    out = {}
    for arg, check in arguments.items():
        value = given.get(arg, check.default if isinstance(check, Default) else None)
        out[arg] = (check.check if isinstance(check, Default) else check)(call, arg, value)
    return out


def _answer(call: Call, exc: CommandError) -> dict:
    """The error reply the caller's RPC raises ``exc`` from; the refusal recorded."""
    call.plugin._refuse(call.job_id if call.job is not None else None, f"command refused: {exc}")
    return error_message(exc, status="uncaught-error")


# -- checkers: (call, argument name, value) -> the value to pass on ---------------------------------
def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) and math.isfinite(x)


def _seq(call: Call, arg: str, value, what: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise call.refuse(arg, f"expected a list of {what}, got {show(value)}")
    return list(value)


def _text(call: Call, arg: str, value, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise call.refuse(arg, f"expected {what} (a non-empty string), got {show(value)}")
    return value


def _index(call: Call, arg: str, value, n: int, what: str) -> int:
    """An int in 0..n-1."""
    if not _is_int(value) or not 0 <= value < n:
        kind = "is outside" if _is_int(value) else "is not an integer in"
        raise call.refuse(arg, f"{what} {show(value)} {kind} 0..{n - 1} of operator {call.op.name!r}")
    return int(value)


def new_job(call: Call, arg: str, value) -> str:
    call.job_id = _text(call, arg, value, "a job id")
    if value in call.plugin.jobs:
        raise call.refuse(arg, f"job {show(value)} is registered already")
    return value


def job(call: Call, arg: str, value) -> str:
    call.job_id = _text(call, arg, value, "a job id")
    if value not in call.plugin.jobs:
        known = sorted(call.plugin.jobs)
        raise call.refuse(arg, f"no job {show(value)} is registered with the balancer plugin; registered "
                               f"jobs: {', '.join(known[:10]) or 'none'}{' ...' if len(known) > 10 else ''}")
    call.job = call.plugin.jobs[value]
    return value


def _operator_name(call: Call, arg: str, value) -> OperatorControl:
    ops = call.control.operators
    if not isinstance(value, str) or value not in ops:
        raise call.refuse(arg, f"job {call.job_id} has no keyed operator {show(value)}; keyed operators: "
                               f"{', '.join(ops) or 'none'}")
    return ops[value]


def operator(call: Call, arg: str, value) -> str:
    call.op = _operator_name(call, arg, value)
    return value


def operators(call: Call, arg: str, value) -> list[str]:
    names = _seq(call, arg, value, "keyed operator names")
    for name in names:
        _operator_name(call, arg, name)
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise call.refuse(arg, f"operator {twice!r} is named twice")
    return names


def strategy(call: Call, arg: str, value) -> str | None:
    if value is not None and (not isinstance(value, str) or value not in STRATEGIES):
        raise call.refuse(arg, f"no migration strategy {show(value)}; valid strategies are "
                               f"{', '.join(STRATEGIES)}")
    return value


def flag(call: Call, arg: str, value) -> bool:
    if not isinstance(value, bool):
        raise call.refuse(arg, f"expected true or false, got {show(value)}")
    return value


def seconds(call: Call, arg: str, value) -> float:
    if not _is_real(value) or value <= 0:
        raise call.refuse(arg, f"expected a finite number of seconds > 0, got {show(value)}")
    return float(value)


def assignment(call: Call, arg: str, value) -> list[list[int]]:
    """``[[key group, instance]...]``, each group once."""
    op = call.op
    out, seen = [], set()
    for pair in _seq(call, arg, value, "[key group, instance] pairs"):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise call.refuse(arg, f"{show(pair)} is not a [key group, instance] pair")
        g = _index(call, arg, pair[0], op.table.key_groups, "key group")
        to = _index(call, arg, pair[1], op.table.parallelism, "instance")
        if g in seen:
            raise call.refuse(arg, f"key group {g} is given twice")
        seen.add(g)
        out.append([g, to])
    return out


def _split_key(call: Call, arg: str, key) -> int:
    """The key group of a split key (an int, a string or a boolean: the key types the hash
    and ``Job.split`` take)."""
    if not (_is_int(key) or isinstance(key, (str, bool, np.bool_))):
        raise call.refuse(arg, f"split key {show(key)} is not an integer, a string or a boolean")
    try:
        return key_group_of(key, call.op.table.key_groups, call.op.name)
    except MigrationError as exc:
        raise call.refuse(arg, str(exc)) from None


def _helpers(call: Call, arg: str, key, helpers, home: int | None = None) -> list[int]:
    n = call.op.table.parallelism
    hs = _seq(call, arg, helpers, f"helper instances of key {show(key)}")
    if not all(_is_int(h) and 0 <= h < n and h != home for h in hs) or len(set(hs)) != len(hs):
        raise call.refuse(arg, f"key {show(key)} cannot be split over helpers {show(helpers)}; helpers are distinct "
                               f"instances in 0..{n - 1} of operator {call.op.name!r}"
                          + ("" if home is None else f" other than the key's home {home}"))
    return [int(h) for h in hs]


def changes(call: Call, arg: str, value) -> list:
    """``[[key, [helper...]]...]`` for an aggregate; no helpers merges the key back."""
    op = call.op
    if not op.splittable:
        raise call.refuse(arg, f"operator {op.name!r} is a {op.kind}: only the keys of an aggregate, or of a "
                               "tumbling or hopping window aggregate, can be split")
    out, seen = [], set()
    for pair in _seq(call, arg, value, "[key, [helper...]] pairs"):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise call.refuse(arg, f"{show(pair)} is not a [key, [helper...]] pair")
        key, helpers = pair
        g = _split_key(call, arg, key)
        if key in seen:
            raise call.refuse(arg, f"key {show(key)} is named twice")
        seen.add(key)
        out.append([key, _helpers(call, arg, key, helpers, int(op.table.owners[g]))])
    return out


def _owners(call: Call, arg: str, value, key_groups: int, parallelism: int | None, what: str) -> list[int]:
    """A table's owners: ``key_groups`` instances in 0..parallelism-1 (None: any >= 0)."""
    ints = isinstance(value, (list, tuple)) and all(_is_int(x) for x in value)   # no bool, no float
    owners = np.asarray(value if ints else [], dtype=np.int64)
    if not ints or owners.shape != (key_groups,):
        raise call.refuse(arg, f"{what} must list the owner (an integer) of each of the {key_groups} key groups, "
                               f"got {show(value)}")
    top = np.iinfo(np.int64).max if parallelism is None else parallelism
    if key_groups and not (0 <= owners.min() and owners.max() < top):
        bad = int(owners[(owners < 0) | (owners >= top)][0])
        valid = "0 or more" if parallelism is None else f"0..{parallelism - 1}"
        raise call.refuse(arg, f"{what} names instance {bad}; valid instances are {valid}")
    return owners.tolist()


def _keys(call: Call, arg: str, value: dict, what: str, required: set, allowed: set) -> None:
    if not isinstance(value, dict):
        raise call.refuse(arg, f"{what} must be a dict with keys {', '.join(sorted(required))}, got {show(value)}")
    extra = sorted(map(repr, set(value) - allowed))
    missing = sorted(required - set(value))
    if extra or missing:
        wrong = f"has unexpected key {extra[0]}" if extra else f"lacks key {missing[0]!r}"
        raise call.refuse(arg, f"{what} {wrong}; its keys are {', '.join(sorted(allowed))}")


def _count(call: Call, arg: str, value, what: str) -> int:
    if not _is_int(value) or value < 0:
        raise call.refuse(arg, f"{what} must be an integer >= 0, got {show(value)}")
    return int(value)


def table(call: Call, arg: str, value) -> dict:
    """A routing table of the operator as ``table_state`` writes it."""
    op = call.op
    _keys(call, arg, value, "the table", {"owners", "epoch"}, {"owners", "epoch", "splits"})
    G, n = op.table.key_groups, op.table.parallelism
    _owners(call, arg, value["owners"], G, n, "the table's owners")
    _count(call, arg, value["epoch"], "the table's epoch")
    for pair in _seq(call, arg, value.get("splits", []), "[key, [helper...]] pairs"):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not pair[1]:
            raise call.refuse(arg, f"split {show(pair)} is not [key, [helper...]] with one helper or more")
        _split_key(call, arg, pair[0])
        _helpers(call, arg, pair[0], pair[1])
    try:
        table_from_state(value, n)
    except (TypeError, ValueError) as exc:
        raise call.refuse(arg, f"not a routing table of operator {op.name!r}: {exc}") from None
    return value


def _peers(call: Call, arg: str, value, what: str, at_least: int = 0) -> None:
    peers = _seq(call, arg, value, f"{what} ([address, actor key] pairs)")
    if len(peers) < at_least or not all(isinstance(p, (list, tuple)) and len(p) == 2
                                        and all(isinstance(s, str) for s in p) for p in peers):
        raise call.refuse(arg, f"{what} must be {at_least} or more [address, actor key] pairs of strings, "
                               f"got {show(value)}")


_TOPOLOGY = {"job", "key_groups", "sources", "instances", "operators"}
_OPERATOR = {"stage", "owners", "routers", "table", "epoch"}


def topology(call: Call, arg: str, value) -> dict:
    """A job's topology as ``Job.topology`` writes it; for a registered job, its update."""
    _keys(call, arg, value, "the topology", _TOPOLOGY, _TOPOLOGY | {"reset"})
    if value["job"] != call.job_id:
        raise call.refuse(arg, f"the topology is of job {show(value['job'])}, not of job {call.job_id}")
    G = value["key_groups"]
    try:
        check_key_groups(G)
    except ValueError as exc:
        raise call.refuse(arg, str(exc)) from None
    known = call.control if call.job is not None else None
    if known is not None and G != known.key_groups:
        raise call.refuse(arg, f"the topology has {G} key groups; job {call.job_id} has {known.key_groups}")
    _peers(call, arg, value["sources"], "the sources")
    _peers(call, arg, value["instances"], "the instances")
    if not isinstance(value.get("reset", False), bool):
        raise call.refuse(arg, f"'reset' must be true or false, got {show(value['reset'])}")
    ops = value["operators"]
    if not isinstance(ops, dict):
        raise call.refuse(arg, f"the operators must be a dict by name, got {show(ops)}")
    for name, spec in ops.items():
        if not isinstance(name, str):
            raise call.refuse(arg, f"operator name {show(name)} is not a string")
        if known is not None and name not in known.operators:
            raise call.refuse(arg, f"job {call.job_id} has no keyed operator {show(name)}; keyed "
                                   f"operators: {', '.join(known.operators) or 'none'}")
        what = f"operator {name!r}"
        _keys(call, arg, spec, what, _OPERATOR, _OPERATOR | {"kind", "merges_lazily", "splittable"})
        _peers(call, arg, spec["owners"], f"the owners of {what}", 1)
        _peers(call, arg, spec["routers"], f"the routers of {what}", 1)
        n = len(spec["owners"])
        # the tables are taken at registration and reset; an update keeps the plugin's (the
        # driver's copy sent may lag it, naming instances a rescale retired)
        taken = known is None or value.get("reset", False)
        _owners(call, arg, spec["table"], G, n if taken else None, f"the table of {what}")
        _count(call, arg, spec["epoch"], f"the epoch of {what}")
        _count(call, arg, spec["stage"], f"the stage of {what}")
        if not isinstance(spec.get("kind", ""), str) or not all(
                isinstance(spec.get(flag, False), bool) for flag in ("merges_lazily", "splittable")):
            raise call.refuse(arg, f"{what}: 'kind' must be a string, 'merges_lazily' and 'splittable' true or false")
        if not taken:
            old = known.operators[name].table        # kept: it must fit the new instances
            used = [int(old.owners.max()), *(h for _, hs in old.splits for h in hs)]
            if max(used) >= n:
                raise call.refuse(arg, f"{what} would have {n} instances, but instance {max(used)} still owns "
                                       "key groups or helps with a split key")
    return value


def balancer(call: Call, arg: str, value) -> str:
    """A registered balancer's name (None: the plugin's default)."""
    value = call.plugin.balancer if value is None else value
    names = available_balancers()
    if not isinstance(value, str) or value not in names:
        raise call.refuse(arg, f"no balancer {show(value)}; valid balancers are {', '.join(sorted(names))}")
    call.balancer = value
    return value


def options(call: Call, arg: str, value) -> dict:
    """Keyword options the balancer is built with."""
    value = {} if value is None else value
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise call.refuse(arg, f"expected a dict of keyword options, got {show(value)}")
    try:
        get_balancer(call.balancer, **value)
    except Exception as exc:
        raise call.refuse(arg, f"balancer {call.balancer!r} cannot be built with them: {type(exc).__name__}: "
                               f"{exc}") from None
    return value


def decision(call: Call, arg: str, value) -> dict:
    """An autoscaler's decision, as the history and the dashboard read it."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise call.refuse(arg, f"expected a dict with string keys, got {show(value)}")
    for k in ("started", "completed"):
        if k in value and not _is_real(value[k]):
            raise call.refuse(arg, f"{k!r} must be a time in seconds, got {show(value[k])}")
    for k in ("operator", "status", "kind"):
        # a failed step names no operator (None): recorded as it is
        if k in value and not isinstance(value[k], str) and not (k == "operator" and value[k] is None):
            raise call.refuse(arg, f"{k!r} must be a string, got {show(value[k])}")
    return value


def wanted(call: Call, arg: str, value) -> dict:
    """Operator name -> the parallelism the autoscaler wants for it."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and _is_int(v) and v >= 1 for k, v in value.items()):
        raise call.refuse(arg, f"expected operator names mapped to parallelisms >= 1, got {show(value)}")
    return value


# -- load reports -------------------------------------------------------------------------------------
def check_load(msg: dict) -> dict:
    """``msg``, a load report, once its scalar fields are checked (the rest is checked where
    it is merged, see ``_reports.report_entry``).

    Raises
    ------
    ValueError
        Naming the field and the value.
    """
    for field in ("job", "operator", "instance", "window_start"):
        if field not in msg:
            raise ValueError(f"load report without {field!r}")
    for field in ("job", "operator"):
        if not isinstance(msg[field], str):
            raise ValueError(f"load report's {field!r} is not a string: {show(msg[field])}")
    if not _is_int(msg["instance"]):
        raise ValueError(f"load report's 'instance' is not an integer: {show(msg['instance'])}")
    if not _is_real(msg["window_start"]):
        raise ValueError(f"load report's 'window_start' is not a finite time: {show(msg['window_start'])}")
    for field in ("records", "queued", "batches", "late_records"):
        v = msg.get(field)
        if v is not None and (not _is_int(v) or v < 0):
            raise ValueError(f"load report's {field!r} is not a count >= 0: {show(v)}")
    if "busy" in msg and (not _is_real(msg["busy"]) or msg["busy"] < 0):
        raise ValueError(f"load report's 'busy' is not a number of seconds >= 0: {show(msg['busy'])}")
    if msg.get("watermark") is not None and not _is_int(msg["watermark"]):
        raise ValueError(f"load report's 'watermark' is not int64 nanoseconds: {show(msg['watermark'])}")
    return msg
