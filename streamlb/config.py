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
    """Like :func:`get` for a duration, returned in seconds."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(get(name, value), default="s"))
