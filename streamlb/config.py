"""Settings under ``streamlb.*`` in dask.config, with the defaults shipped in the package."""
from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml

_fn = os.path.join(os.path.dirname(__file__), "streamlb.yaml")
with open(_fn) as _f:
    _defaults = yaml.safe_load(_f)
dask.config.update_defaults(_defaults)


def get(name: str, value: Any = None) -> Any:
    """Return ``value`` if it is not None, else the setting ``streamlb.<name>``."""
    if value is not None:
        return value
    return dask.config.get(f"streamlb.{name}")


def seconds(name: str, value: Any = None) -> float:
    """Like :func:`get` for a duration (a number is seconds, a string carries its unit:
    :func:`streamlb._time.duration_ns`), returned in seconds."""
    from ._time import duration_s

    return duration_s(get(name, value), f"streamlb.{name}")
