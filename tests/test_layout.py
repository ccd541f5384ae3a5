"""The import direction of docs/runtime.md ("Size conventions"), checked over the source:
no import cycle inside ``streamlb/`` (sizes are a smell to look at, not a limit: nothing
here counts lines).

An import counts wherever it is written (inside a function too), except under ``if
TYPE_CHECKING:``, which never runs. Importing ``a.b.c`` also runs the packages ``a.b``'s
``__init__`` (unless the importer is inside it): a package that imported its submodules would
close a cycle through them, as ``streamlb._worker`` once did (importing
``streamlb._worker._owner`` first failed)."""
from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "streamlb")


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
