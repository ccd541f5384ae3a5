"""The layers of docs/runtime.md ("Layers"), checked over the source: every import points to
its own layer or a lower one, no two parts of ``streamlb/`` (a top-level module or package)
import each other in a loop, no module cycle, and a worker process of a real job never loads
the user API (the planner, the nodes, streamz). Sizes are a smell to look at, not a limit:
nothing here counts lines.

An import counts wherever it is written (inside a function too), except under ``if
TYPE_CHECKING:``, which never runs. Importing ``a.b.c`` also runs the packages ``a.b``'s
``__init__`` (unless the importer is inside it): a package that imported its submodules would
close a cycle through them, as ``streamlb._worker`` once did (importing
``streamlb._worker._owner`` first failed)."""
from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "streamlb")

#: Each part of ``streamlb/`` (``streamlb.<name>``, a module or a package) in its layer,
#: bottom to top; a part imports only its own layer or lower ones. The package itself
#: (``streamlb/__init__.py``, which loads the user API only on first use) is the top.
LAYERS = {
    1: "core: pure and flat",
    2: "the plan model, state stores, sources, sinks, checkpoint storage",
    3: "the worker: the Instance actor and its parts, the worker side of an epoch",
    4: "coordination: migration epochs, the scheduler plugin, what it serves",
    5: "the driver: Job's parts, reconfiguration, placement, checkpoint coordination, recovery",
    6: "the user API and the entry points",
}
LAYER = {
    **dict.fromkeys(("exceptions", "config", "keygroups", "routing", "latency", "hotkeys", "_time", "_functions",
                     "_registry", "balancer", "scaler", "simulator", "_shuffle", "_plot"), 1),
    **dict.fromkeys(("_plan", "_state", "_sources", "_sinks", "_checkpoint"), 2),
    "_worker": 3,
    **dict.fromkeys(("_migration", "_observe", "plugin", "_jobs"), 4),
    **dict.fromkeys(("_job", "_reconfig", "_recovery", "_placement"), 5),
    **dict.fromkeys(("nodes", "planner", "cli", "datasets", "runtime", "nexmark", "__main__", "_streamz_hook",
                     "service"), 6),
}
#: What a worker process must never have loaded (the user API and what only it needs).
USER_API = ("streamlb.planner", "streamlb.nodes", "streamlb.runtime", "streamz")


def _modules() -> dict[str, str]:
    """Dotted name -> path of every module below streamlb/ (a package by its own name)."""
    out = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path[:-3], os.path.dirname(ROOT)).replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``."""
    skip = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            for stmt in n.body:
                skip.update(id(x) for x in ast.walk(stmt))
    return skip


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement may load (a ``from`` import's names may be modules)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module
    return [target] + [f"{target}.{a.name}" for a in node.names]


def _imports() -> dict[str, set[str]]:
    mods = _modules()
    packages = {m for m, p in mods.items() if p.endswith("__init__.py")}
    edges = {}
    for m, path in mods.items():
        tree = ast.parse(open(path).read())
        skip = _type_checking_only(tree)
        found = set()
        for n in ast.walk(tree):
            if not isinstance(n, (ast.Import, ast.ImportFrom)) or id(n) in skip or \
                    (isinstance(n, ast.ImportFrom) and n.module == "__future__"):
                continue
            for t in _targets(m, m in packages, n):
                parts = t.split(".")
                # the module itself and the packages whose __init__ importing it runs
                for i in range(2, len(parts) + 1):
                    name = ".".join(parts[:i])
                    if name in mods and name != m and not m.startswith(name + ".") and \
                            (i == len(parts) or name in packages):
                        found.add(name)
        edges[m] = found
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _part(module: str) -> str:
    """``streamlb.a.b.c`` -> ``a``: the top-level module or package a module belongs to."""
    return module.split(".")[1] if "." in module else ""


def _layer(module: str) -> int:
    part = _part(module)
    return 6 if part == "" else LAYER[part]


def _upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import that points to a higher layer, as ``importer (Ln) -> imported (Lm)``."""
    return sorted(f"{m} (L{_layer(m)}) -> {t} (L{_layer(t)})" for m, ts in edges.items() for t in ts
                  if _layer(t) > _layer(m))


def _part_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The loops between parts: the module graph collapsed to ``streamlb.<part>``."""
    parts: dict[str, set[str]] = {}
    for m, ts in edges.items():
        if _part(m):
            parts.setdefault(_part(m), set()).update(_part(t) for t in ts if _part(t) and _part(t) != _part(m))
    for ts in list(parts.values()):
        for t in ts:
            parts.setdefault(t, set())
    return _cycles(parts)


def test_every_part_of_streamlb_has_a_layer():
    parts = {_part(m) for m in _modules()} - {""}
    assert parts - set(LAYER) == set(), "add these to LAYER (tests/test_layout.py) and docs/runtime.md's diagram"
    assert set(LAYER) - parts == set(), "LAYER names parts that are gone"


def test_every_import_points_to_its_own_layer_or_a_lower_one():
    upward = _upward(_imports())
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_no_two_parts_import_each_other():
    cycles = _part_cycles(_imports())
    assert not cycles, "parts that import each other in a loop: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_layer_check_finds_an_upward_import():
    # a store (layer 2) that imports the worker (layer 3), as _state/_backends.py once did
    edges = {"streamlb._state._backends": {"streamlb._worker._join_op", "streamlb._time"},
             "streamlb._worker._join_op": {"streamlb._state._joins"}, "streamlb._state._joins": set(),
             "streamlb._time": set()}
    assert _upward(edges) == ["streamlb._state._backends (L2) -> streamlb._worker._join_op (L3)"]
    assert _part_cycles(edges) == [["_state", "_worker"]]
    assert _upward({"streamlb._worker._x": {"streamlb._state._y"}}) == []


def test_a_worker_process_never_loads_the_user_api(cli_cluster):
    """`dask worker` processes on loopback, as a user starts them, run a job with a keyed
    aggregate and an event-time window; then none of them has imported the planner, the
    nodes or streamz (the actors, the stages and the steps they get are from layers 1-3)."""
    import sys

    import numpy as np
    import pandas as pd
    from distributed import Client
    from streamz import Stream

    import streamlb

    rng = np.random.default_rng(5)
    df = pd.DataFrame({"k": rng.integers(0, 50, 4000), "v": rng.integers(0, 100, 4000),
                       "t": pd.to_datetime(np.sort(rng.integers(0, 10**10, 4000)))})
    src = Stream.from_iterable([df.iloc[:2000], df.iloc[2000:]]).with_watermark("t", delay="1s")
    src.key_by("k").aggregate({"total": ("v", "sum")}, name="totals")
    src.key_by("k").window(size="5s").aggregate({"n": ("v", "count")}, name="counts")
    job = streamlb.run(src, address=cli_cluster)
    try:
        job.wait(timeout=120)
        totals = job.state("totals")["total"].sort_index()
    finally:
        job.stop()
    expect = df.groupby("k")["v"].sum().sort_index()
    assert totals.tolist() == expect.tolist() and totals.index.tolist() == expect.index.tolist()
    assert "streamz" in sys.modules        # the driver has them (the check below can fail)

    def loaded(names=USER_API):
        import sys

        return sorted(m for m in sys.modules if m in names or m.startswith(tuple(n + "." for n in names)))

    with Client(cli_cluster) as c:
        per_worker = c.run(loaded)
        assert len(per_worker) == 2 and c.run(lambda: "streamlb._worker._instance" in sys.modules) == \
            dict.fromkeys(per_worker, True)
    assert per_worker == dict.fromkeys(per_worker, [])


def test_no_import_cycle_inside_streamlb():
    edges = _imports()
    assert "streamlb._worker._owner" in edges and edges["streamlb.nodes"]   # the walk found the modules
    cycles = _cycles(edges)
    assert not cycles, "\n".join(" -> ".join(f"{m} (imports {sorted(edges[m] & set(c))})" for m in c)
                                 for c in cycles)


def test_the_cycle_check_finds_a_cycle_through_a_package_init():
    edges = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"q.c"}, "q.c": {"p"}, "r": {"p.a"}}
    assert _cycles(edges) == [["p", "p.a", "p.b", "q.c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
