"""streamlb's nodes on ``streamz.Stream`` whenever streamz is loaded, without loading it.

``import streamlb`` registers ``from_parquet``, ``key_by``, ``aggregate`` ... on
``streamz.Stream`` as it always did, but only in a process that uses streamz: if streamz is
already imported the nodes load now; otherwise a finder on ``sys.meta_path`` loads them right
after streamz finishes importing. A Dask worker process, which imports ``streamlb`` for the
actors it runs and never streamz, so never loads the user API (the planner, the nodes).
"""
from __future__ import annotations

import importlib
import importlib.abc
import sys


def _load_nodes() -> None:
    importlib.import_module("streamlb.nodes")


class _AfterStreamz(importlib.abc.MetaPathFinder):
    """Finds ``streamz`` through the other finders and loads the nodes once it has run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "streamz":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenNodes(spec.loader)
                return spec
        return None


class _ThenNodes(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _unhook()
        _load_nodes()

    def __getattr__(self, name):             # get_resource_reader, get_source, ... as the real loader
        return getattr(self.loader, name)


_FINDER = _AfterStreamz()


def _unhook() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def register_nodes_with_streamz() -> None:
    """Register the nodes now if streamz is loaded, else as soon as it is."""
    if "streamz" in sys.modules:
        _load_nodes()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
