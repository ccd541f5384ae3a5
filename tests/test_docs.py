"""The docs site builds without a warning and gives every public name an entry.

The build runs in a subprocess, as ``tox -e docs`` runs it (``-W --keep-going``), so a
warning anywhere (a docstring numpydoc cannot parse, a broken link between pages, a page in
no toctree) fails the test with Sphinx's message.
"""
from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import streamz

import streamlb

DOCS = Path(__file__).resolve().parent.parent / "docs"

# Modules with a page of the API reference: each public name (its ``__all__``) has an entry
# under the module, or under ``streamlb`` when the top level re-exports it.
MODULES = [
    "streamlb.balancer",
    "streamlb.datasets",
    "streamlb.nexmark",
    "streamlb.simulator",
    "streamlb.scaler",
    "streamlb.keygroups",
    "streamlb.routing",
    "streamlb.plugin",
    "streamlb.exceptions",
    "streamlb.latency",
]

# Classes whose public methods and properties each have an entry.
CLASSES = ["streamlb.Job", "streamlb.RoutingTable", "streamlb.LoadReport", "streamlb.Balancer",
           "streamlb.scaler.Scaler", "streamlb.simulator.Trace"]


def _inventory(path: Path) -> dict[str, str]:
    """Object name -> ``domain:role`` from an ``objects.inv`` (format version 2)."""
    raw = path.read_bytes()
    header = b"".join(raw.splitlines(keepends=True)[:4])
    assert header.startswith(b"# Sphinx inventory version 2"), header
    body = zlib.decompress(raw[len(header):]).decode()
    out = {}
    for line in body.splitlines():
        m = re.match(r"(.+?)\s+(\S+?:\S+)\s+(-?\d+)\s+(\S*)\s+(.*)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("html")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, f"the docs build failed or warned:\n{proc.stderr}"
    return _inventory(out / "objects.inv")


def _resolve(dotted: str):
    mod, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def test_top_level_names(inventory):
    missing = [f"streamlb.{n}" for n in streamlb.__all__ if f"streamlb.{n}" not in inventory]
    assert not missing, f"no entry in the API reference for {missing}"


@pytest.mark.parametrize("module", MODULES)
def test_module_names(inventory, module):
    mod = importlib.import_module(module)
    missing, own = [], 0
    for name in mod.__all__:
        top = name in streamlb.__all__ and getattr(streamlb, name) is getattr(mod, name)
        own += not top
        if f"{module}.{name}" not in inventory and not (top and f"streamlb.{name}" in inventory):
            missing.append(f"{module}.{name}")
    assert not missing, f"no entry in the API reference for {missing}"
    if own:     # names of its own, not only re-exports: the module has a page
        assert inventory.get(module) == "py:module", f"{module} has no page in the API reference"


def test_stream_nodes(inventory):
    from streamlb import nodes

    assert inventory.get("streamlb.nodes") == "py:module"
    missing = [f"streamz.Stream.{n}" for n in nodes.__all__ if f"streamz.Stream.{n}" not in inventory]
    assert not missing, f"no entry in the API reference for {missing}"
    assert all(hasattr(streamz.Stream, n) for n in nodes.__all__)


@pytest.mark.parametrize("cls", CLASSES)
def test_class_members(inventory, cls):
    klass = _resolve(cls)
    kinds = (property, classmethod, staticmethod)
    public = [n for n, v in vars(klass).items()
              if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, kinds))]
    assert public
    missing = [f"{cls}.{n}" for n in public if f"{cls}.{n}" not in inventory]
    assert not missing, f"no entry in the API reference for {missing}"
