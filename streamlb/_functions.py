"""User functions travel to the workers by value.

Standard pickle sends a function by reference (module + name), which fails on a worker that
cannot import the user's script, test module or notebook. Like Spark, streamlb ships user code
itself; functions from installed packages still travel by reference.
"""
from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cloudpickle
import numpy as np

from .exceptions import UnpicklableFunctionError, UserFunctionError

if TYPE_CHECKING:
    import pandas as pd

_INSTALLED = tuple(
    os.path.realpath(p) + os.sep
    for p in {*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["stdlib"],
              sysconfig.get_paths()["platstdlib"]}
    if p
)


def describe(func: Callable[..., Any]) -> str:
    """A readable name for a user function, for error messages."""
    func = getattr(func, "func", func) if type(func).__name__ == "UserFunction" else func
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module and module != "builtins" else name


def _is_user_module(name: str | None) -> bool:
    mod = sys.modules.get(name or "")
    if mod is None or name == "__main__":
        return False            # cloudpickle already sends these by value
    fn = getattr(mod, "__file__", None)
    if not fn:
        return False
    fn = os.path.realpath(fn)
    return not fn.startswith(_INSTALLED) and not name.startswith("streamlb")


def _load(payload: bytes):
    return UserFunction(cloudpickle.loads(payload), payload)


class UserFunction:
    """A callable that pickles its function by value (see module docstring)."""

    __slots__ = ("func", "_payload")

    def __init__(self, func, payload: bytes | None = None) -> None:
        self.func = func.func if isinstance(func, UserFunction) else func
        self._payload = payload

    def __call__(self, *args, **kwargs):
        return self.func(*args, **kwargs)

    def payload(self, operator: str = "") -> bytes:
        if self._payload is None:
            name = getattr(self.func, "__module__", None)
            # leave a registration the user made in place: undo only our own
            by_value = _is_user_module(name) and name not in cloudpickle.list_registry_pickle_by_value()
            if by_value:
                cloudpickle.register_pickle_by_value(sys.modules[name])
            try:
                self._payload = cloudpickle.dumps(self.func)
            except Exception as exc:
                raise UnpicklableFunctionError(
                    f"operator {operator!r}: function {describe(self.func)} cannot be pickled to "
                    f"send it to the workers ({type(exc).__name__}: {exc}); use a module-level "
                    "function or a lambda that captures only picklable values"
                ) from exc
            finally:
                if by_value:
                    cloudpickle.unregister_pickle_by_value(sys.modules[name])
        return self._payload

    def __reduce__(self):
        return (_load, (self.payload(),))


class Where:
    """A join's ``where(joined) -> mask``, checked and named in errors."""

    def __init__(self, operator: str, func) -> None:
        self.operator, self.func = operator, getattr(func, "func", func)

    def __call__(self, joined: pd.DataFrame) -> np.ndarray:
        what = f"join {self.operator!r}: where function {describe(self.func)}"
        try:
            mask = np.asarray(self.func(joined))
        except Exception as exc:
            raise UserFunctionError(f"{what} raised {type(exc).__name__}: {exc} on {len(joined)} joined rows",
                                    operator=self.operator, function=describe(self.func)) from exc
        if mask.shape != (len(joined),) or mask.dtype.kind != "b":
            raise UserFunctionError(f"{what} returned {mask.dtype} of shape {mask.shape} for {len(joined)} joined "
                                    "rows; return one boolean per row", operator=self.operator,
                                    function=describe(self.func))
        return mask
