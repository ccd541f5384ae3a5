"""Two commits side by side in one sitting: ``benchmarks.jobs`` run alternately with the
``streamlb`` of each (issue 27's "at the parent commit, measured in the same run").

``python asv_bench/ab.py BASE [HEAD] --op stateful_map --rounds 3 [--rows N] [--rate R]
[--state-backend B [--base-state-backend B0]]`` (with BASE and HEAD one commit, e.g.
``HEAD --base-state-backend memory --state-backend rocksdb``: the two backends side by side)
(or ``--bench migration --strategy lazy [--batch N] [--moves K --save F]`` for
``benchmarks.migration``, K moves a run whose figures go to the JSON lines of F, or
``--bench nexmark --query q12`` for ``benchmarks.nexmark``'s streamlb runs, or ``--bench
throughput --op stateful_map`` for the asv ``Throughput`` figures)
checks each commit out in a worktree under the temporary directory (HEAD: the working tree
itself when omitted), then per round runs ``python -m benchmarks.jobs`` once with each
(``PYTHONPATH`` set to its tree; the job script is this tree's, using only the public
API), alternating which goes first. Prints every run and the medians of the per-round
ratios: records/s HEAD over BASE, and p99 latency HEAD over BASE.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def tree(commit: str | None) -> str:
    """A checkout of ``commit`` (the working tree for None)."""
    if commit is None:
        return ROOT
    sha = subprocess.check_output(["git", "-C", ROOT, "rev-parse", commit], text=True).strip()
    path = os.path.join(tempfile.gettempdir(), f"streamlb-ab-{sha[:12]}")
    if not os.path.exists(path):
        subprocess.check_call(["git", "-C", ROOT, "worktree", "add", "--detach", path, sha],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


def runs(src: str, args: list[str], module: str = "benchmarks.jobs") -> list[dict]:
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + HERE)
    out = subprocess.run([sys.executable, "-m", module, *args], cwd=HERE, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{module} with {src} failed:\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


MIGRATION = ["first_record_ms", "switch_ms", "max_latency_ms", "p99_during_ms", "migration_s"]


def migration(trees: dict, a) -> None:
    """``--bench migration``: ``benchmarks.migration``'s run of one strategy, a fresh cluster
    per run, the commits alternating; HEAD over BASE per round for each figure (with
    ``--moves`` K, each run's figure is the median over its K moves), and the median of
    those ratios."""
    args = (["--strategy", a.strategy, "--runs", a.runs, "--moves", str(a.moves)]
            + (["--batch", a.batch] if a.batch else []))
    ratios = {k: [] for k in MIGRATION}
    for r in range(a.rounds):
        fig = {}
        for name in (("base", "head") if r % 2 == 0 else ("head", "base")):
            got = runs(trees[name], args, "benchmarks.migration")
            if a.save:                  # every move's figures, for intervals and pooling later
                with open(a.save, "a") as f:
                    f.writelines(json.dumps({"round": r, "commit": name, **x}) + "\n" for x in got)
            fig[name] = {k: statistics.median(x[k] for x in got) for k in MIGRATION}
            print(f"round {r + 1}/{a.rounds} {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in fig[name].items()),
                  flush=True)
        for k in MIGRATION:
            ratios[k].append(fig["head"][k] / fig["base"][k])
    for k, v in ratios.items():
        print(f"{k}: head/base median {statistics.median(v):.3f} over {a.rounds} rounds "
              f"(rounds {', '.join(f'{x:.3f}' for x in v)})")


def _alternate(a, one, label: str) -> None:
    """``a.rounds`` rounds of ``one(name) -> figure`` for "base" and "head", alternating which
    goes first; prints HEAD over BASE per round and the median of those ratios."""
    ratios = []
    for r in range(a.rounds):
        fig = {name: one(name, f"round {r + 1}/{a.rounds} {name}")
               for name in (("base", "head") if r % 2 == 0 else ("head", "base"))}
        ratios.append(fig["head"] / fig["base"])
    print(f"{label}: head/base median {statistics.median(ratios):.3f} over {a.rounds} rounds "
          f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")


def nexmark(trees: dict, a) -> None:
    """``--bench nexmark``: one query's events/s (``benchmarks.nexmark``, one cluster per
    process, a warm-up then ``--runs`` runs whose median is the round's figure), the commits
    alternating; HEAD over BASE per round, and the median of those ratios."""
    def one(name: str, said: str) -> float:
        got = runs(trees[name], ["--query", a.query, "--runs", a.runs], "benchmarks.nexmark")
        fig = statistics.median(x["events_per_second"] for x in got)
        print(f"{said}: {a.query} " + ", ".join(f"{x['seconds']:.3f} s" for x in got)
              + f"; median {fig:,.0f} events/s", flush=True)
        return fig
    _alternate(a, one, f"{a.query} events/s")


def throughput(trees: dict, a) -> None:
    """``--bench throughput``: ``benchmarks.throughput``'s figure for ``--op`` (the asv
    ``Throughput`` benchmark: a fresh cluster, a warm-up, the median of three jobs), the
    commits alternating; HEAD over BASE per round, and the median of those ratios."""
    def one(name: str, said: str) -> float:
        fig = runs(trees[name], ["--op", a.op], "benchmarks.throughput")[0]["records_per_second"]
        print(f"{said}: {a.op} {fig:,.0f} records/s", flush=True)
        return fig
    _alternate(a, one, f"{a.op} records/s")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base")
    p.add_argument("head", nargs="?")
    p.add_argument("--op", default="aggregate")
    p.add_argument("--rows", default="5000000")
    p.add_argument("--rate", default=None)
    p.add_argument("--runs", default=None,
                   help="runs per process, their median the round's figure (default 3 jobs and nexmark; 1 migration)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--state-backend", default=None, choices=["memory", "rocksdb"],
                   help="jobs: the runs' state backend (HEAD's, and BASE's unless --base-state-backend)")
    p.add_argument("--base-state-backend", default=None, choices=["memory", "rocksdb"],
                   help="jobs: BASE's state backend")
    p.add_argument("--bench", default="jobs", choices=["jobs", "migration", "nexmark", "throughput"],
                   help="jobs: benchmarks.jobs (records/s, p99); migration: benchmarks.migration; "
                        "nexmark: benchmarks.nexmark (one query's events/s); throughput: the asv "
                        "Throughput benchmark's --op (aggregate or stateful_map)")
    p.add_argument("--query", default="q12", help="--bench nexmark: the query")
    p.add_argument("--strategy", default="lazy", help="--bench migration: the strategy")
    p.add_argument("--batch", default=None, help="--bench migration: the sources' rows per batch")
    p.add_argument("--moves", type=int, default=1,
                   help="--bench migration: moves per run (benchmarks.migration --moves); a run's "
                        "figure is the median over its moves")
    p.add_argument("--save", default=None, help="--bench migration: append every move's figures "
                                                "(JSON lines) to this file")
    a = p.parse_args(argv)
    if a.bench == "migration":
        a.runs = a.runs or "1"
        return migration({"base": tree(a.base), "head": tree(a.head)}, a)
    if a.bench == "nexmark":
        a.runs = a.runs or "3"
        return nexmark({"base": tree(a.base), "head": tree(a.head)}, a)
    if a.bench == "throughput":
        return throughput({"base": tree(a.base), "head": tree(a.head)}, a)
    a.runs = a.runs or "3"
    job = ["--op", a.op, "--rows", a.rows, "--runs", a.runs] + (["--rate", a.rate] if a.rate else [])
    trees = {"base": tree(a.base), "head": tree(a.head)}
    backends = {"head": a.state_backend, "base": a.base_state_backend or a.state_backend}
    speed, p99 = [], []
    for r in range(a.rounds):
        fig = {}
        for name in (("base", "head") if r % 2 == 0 else ("head", "base")):
            got = runs(trees[name], job + (["--state-backend", backends[name]] if backends[name] else []))
            fig[name] = (statistics.median(x["records_per_second"] for x in got),
                         statistics.median(x["p99_ms"] for x in got))
            each = "; ".join(f"{x['seconds']:.3f} s {x['records_per_second'] / 1e6:.2f}M rec/s "
                             f"p99 {x['p99_ms']:.1f} ms" for x in got)
            print(f"round {r + 1}/{a.rounds} {name} ({a.head or 'working tree'} vs {a.base}): {each}", flush=True)
        speed.append(fig["head"][0] / fig["base"][0])
        p99.append(fig["head"][1] / fig["base"][1])
        print(f"round {r + 1}: records/s head/base {speed[-1]:.3f}, p99 head/base {p99[-1]:.3f}", flush=True)
    print(f"median over {a.rounds} rounds: records/s head/base {statistics.median(speed):.3f} "
          f"(rounds {', '.join(f'{x:.3f}' for x in speed)}); p99 latency head/base {statistics.median(p99):.3f} "
          f"(rounds {', '.join(f'{x:.3f}' for x in p99)})")


if __name__ == "__main__":
    main()
