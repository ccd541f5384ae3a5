"""The verbs that operate a cluster's jobs: ``streamlb submit``, ``streamlb jobs`` and
``streamlb job stop|cancel|savepoint|rescale|describe NAME``.

Each reaches the scheduler at ``--address`` (default: dask's ``scheduler-address``
setting, e.g. the environment variable ``DASK_SCHEDULER_ADDRESS``), with TLS options as
Dask's own command line takes them; a refused command prints the reason and exits 2,
having changed nothing.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import sys
import time

from .._time import age as _age
from ._args import _command

__all__ = ["add_parsers", "load_pipeline"]

#: A script or module handed to ``streamlb submit`` defines this function, returning the node.
DEFAULT_FUNCTION = "pipeline"


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="the scheduler, e.g. tcp://host:8786 (default: dask setting scheduler-address, "
                        "or $DASK_SCHEDULER_ADDRESS)")
    p.add_argument("--tls-ca-file", default=None, help="CA certificate of a TLS cluster")
    p.add_argument("--tls-cert", default=None, help="this client's certificate (TLS)")
    p.add_argument("--tls-key", default=None, help="this client's private key (TLS)")


def _connect(args):
    """``(address, security)`` from the arguments."""
    import dask.config

    address = args.address or dask.config.get("scheduler-address", None) or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if not address:
        raise SystemExit(f"streamlb {args.command}: give the scheduler with --address (or set DASK_SCHEDULER_ADDRESS)")
    security = None
    if args.tls_ca_file or args.tls_cert or args.tls_key:
        from distributed.security import Security

        security = Security(tls_ca_file=args.tls_ca_file, tls_client_cert=args.tls_cert,
                            tls_client_key=args.tls_key, require_encryption=True)
    return address, security


def _jobs(args) -> int:
    from ..service import jobs

    address, security = _connect(args)
    table = jobs(address, security=security)
    if args.json:
        print(table.to_json(orient="records"))
        return 0
    if table.empty:
        print(f"no jobs on {address}")
        return 0
    rows = [("NAME", "ID", "STATUS", "UPTIME", "PARALLELISM", "RECORDS/S", "CHECKPOINT", "AGE", "RESTARTS")]
    for r in table.itertuples():
        par = ",".join(f"{k}={v}" for k, v in (r.parallelism or {}).items())
        rate = "-" if r.records_per_s is None or r.records_per_s != r.records_per_s else f"{r.records_per_s:,.0f}"
        ck = "-" if r.checkpoint is None or r.checkpoint != r.checkpoint else str(int(r.checkpoint))
        rows.append((r.name, r.id, r.status, _age(r.uptime), par or "-", rate, ck, _age(r.checkpoint_age),
                     f"{int(r.restarts)}+{int(r.recoveries)}"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
    for r in table.itertuples():
        if r.error:
            print(f"{r.name}: {r.error}")
    return 0


def _job(args) -> int:
    from ..service import attach

    address, security = _connect(args)
    with attach(address, args.name, security=security) as job:
        verb = args.verb
        if verb == "stop":
            t0 = time.time()
            path = job.stop(savepoint=args.savepoint)
            print(f"job {args.name} stopped in {time.time() - t0:.1f} s: what its sources read is processed and "
                  "committed" + (f"; savepoint at {path}" if path else ""))
        elif verb == "cancel":
            job.cancel()
            print(f"job {args.name} cancelled")
        elif verb == "savepoint":
            print(f"savepoint of job {args.name} written to {job.savepoint(args.path)}")
        elif verb == "rescale":
            now = job.rescale(args.operator, args.parallelism)
            print(f"job {args.name}: operator {args.operator!r} runs as {now} instances")
        elif verb == "describe":
            rec = job.describe()
            if args.json:
                print(json.dumps(rec, indent=1, default=str))
            else:
                _describe(rec)
    return 0


def _describe(rec: dict) -> None:
    info = rec.get("info") or {}
    cp = info.get("checkpoint") or {}
    drv = rec.get("driver") or {}
    lines = [
        ("name", rec["name"]), ("id", rec["id"]), ("status", rec["status"]),
        ("submitted", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec["submitted"]))),
        ("uptime", _age(rec.get("uptime"))),
        ("restarts", f"{rec.get('restarts', 0)} driver(s) started again, {info.get('recoveries', 0)} recoveries "
                     "from lost workers"),
        ("reason", rec.get("reason") or "-"), ("error", rec.get("error") or "-"),
        ("operators", ", ".join(f"{k} x{v}" for k, v in (info.get("parallelism") or {}).items()) or "-"),
        ("records", f"{info.get('records', 0):,} read, {info.get('records_per_s', 0):,.0f}/s"),
        ("checkpoints", rec.get("checkpoint") or "none (a lost driver fails the job)"),
        ("last checkpoint", f"{cp.get('id')} ({_age(time.time() - cp['completed'])} ago)" if cp.get("completed")
         else "-"),
        ("driver", f"pid {drv.get('pid')} (driver {drv.get('incarnation')}), log {drv.get('log')}" if drv else "-"),
        ("workers", str(info.get("workers", rec.get("workers")))), ("registry", rec.get("registry", "-")),
        ("versions", ", ".join(f"{k} {v}" for k, v in (rec.get("versions") or {}).items())),
    ]
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k.ljust(width)}  {v}")


def load_pipeline(target: str, argv: list[str]):
    """The node ``target`` builds: ``script.py[:function]`` or ``package.module:function``
    (function default ``pipeline``), called with ``argv``."""
    path, _, func = target.partition(":") if not os.path.exists(target) else (target, "", "")
    func = func or DEFAULT_FUNCTION
    if path.endswith(".py") or os.path.exists(path):
        if not os.path.isfile(path):
            raise SystemExit(f"streamlb submit: no script {path!r}")
        namespace = runpy.run_path(path, run_name="__streamlb_submit__")
        where = f"script {path}"
    else:
        try:
            namespace = vars(importlib.import_module(path))
        except ImportError as exc:
            raise SystemExit(f"streamlb submit: module {path!r} cannot be imported: {exc}") from None
        where = f"module {path}"
    fn = namespace.get(func)
    if not callable(fn):
        raise SystemExit(f"streamlb submit: {where} defines no function {func!r} returning the pipeline's node "
                         f"(name another with {path}:FUNCTION)")
    return fn(*argv)


def _submit(args) -> int:
    from ..service import submit

    address, security = _connect(args)
    sys.path.insert(0, os.getcwd())
    node = load_pipeline(args.target, args.args)
    options = {k: v for k, v in {
        "checkpoint": args.checkpoint, "checkpoint_interval": args.checkpoint_interval, "restore": args.restore,
        "parallelism": args.parallelism, "balancer": args.balancer, "key_groups": args.key_groups,
        "state_backend": args.state_backend}.items() if v is not None}
    job = submit(node, address=address, name=args.name, security=security, **options)
    rec = job.describe()
    print(f"job {rec['name']} ({rec['id']}) submitted to {address}: {rec['status']}"
          + (f", checkpoints to {rec['checkpoint']}" if rec.get("checkpoint") else ""))
    job.close()
    return 0


def _guarded(func):
    def run(args) -> int:
        from ..exceptions import StreamlbError

        try:
            return func(args)
        except StreamlbError as exc:
            what = f"{args.command} {getattr(args, 'verb', '')}".strip()
            print(f"streamlb {what}: {exc}", file=sys.stderr)
            return 2
    return run


def add_parsers(sub) -> None:
    """``submit``, ``jobs`` and ``job`` on the subparsers ``sub``."""
    s = _command(sub, "submit", "hand a pipeline to a cluster, which runs it after this command exits")
    s.add_argument("target", help="script.py[:FUNCTION] or package.module:FUNCTION; FUNCTION (default "
                                  f"{DEFAULT_FUNCTION}) returns any node of the pipeline")
    s.add_argument("args", nargs="*", help="arguments for FUNCTION (strings)")
    s.add_argument("--name", default=None, help="the job's name (default job-<id>)")
    s.add_argument("--checkpoint", default=None, help="checkpoint directory (without it a lost driver fails the job)")
    s.add_argument("--checkpoint-interval", default=None, help="e.g. 1s, 500ms (default: setting, 1s)")
    s.add_argument("--restore", default=None, help="start from this savepoint or checkpoint")
    s.add_argument("--parallelism", type=int, default=None, help="instances per operator")
    s.add_argument("--balancer", default=None, help="a registered balancer (static, autoflow, ...)")
    s.add_argument("--key-groups", type=int, default=None, help="key groups (default: setting)")
    s.add_argument("--state-backend", default=None, choices=["memory", "rocksdb"], help="where keyed state lives")
    _connection(s)
    s.set_defaults(func=_guarded(_submit))

    j = _command(sub, "jobs", "list a cluster's jobs: status, uptime, parallelism, records/s, "
                              "last checkpoint, restarts")
    j.add_argument("--json", action="store_true", help="one JSON record per job")
    _connection(j)
    j.set_defaults(func=_guarded(_jobs))

    job = _command(sub, "job", "operate one job of a cluster: stop, cancel, savepoint, rescale, describe")
    verbs = job.add_subparsers(dest="verb", required=True)
    v = _command(verbs, "stop", "end the job gracefully: what its sources read is processed and committed")
    v.add_argument("name")
    v.add_argument("--savepoint", default=None, help="write a savepoint at that point (a path that does not exist)")
    v = _command(verbs, "cancel", "abort the job: nothing more is committed")
    v.add_argument("name")
    v = _command(verbs, "savepoint", "write a savepoint of the running job")
    v.add_argument("name")
    v.add_argument("path", help="a directory or URL that does not exist yet")
    v = _command(verbs, "rescale", "change an operator's parallelism while the job runs")
    v.add_argument("name")
    v.add_argument("operator")
    v.add_argument("parallelism", type=int)
    v = _command(verbs, "describe", "the job's record: status, driver, checkpoints, restarts, error")
    v.add_argument("name")
    v.add_argument("--json", action="store_true", help="the record as JSON")
    for p in verbs.choices.values():
        _connection(p)
    job.set_defaults(func=_guarded(_job))
