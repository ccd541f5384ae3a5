"""What the command line's verbs share: how a command is added, its argument types
(``--rescale FROM:TO``, a balancer's name) and the latency summary they print (``streamlb
demo``, ``streamlb nexmark``)."""
from __future__ import annotations

import argparse


def _latencies(ops) -> dict:
    """p50, p99 and max latency (ms) of the records applied in the metrics rows ``ops``:
    the percentiles are of every record, from the windows' histograms added up (not a
    percentile of per-window percentiles); NaN where none was applied."""
    import numpy as np

    from .. import latency

    hists = ops.latency_hist.to_list()
    total = np.sum(np.stack(hists), axis=0) if hists else np.zeros(latency.BINS, np.int64)
    top = float(ops.latency_max_ms.max()) if len(ops) else float("nan")
    # a percentile is interpolated within its histogram bin: never above the largest latency seen
    return {"p50": min(latency.quantile(total, 0.5), top), "p99": min(latency.quantile(total, 0.99), top),
            "max": top}


def _command(sub, name: str, text: str) -> argparse.ArgumentParser:
    """Command ``name`` on the subparsers ``sub``: its one line ``text`` shows in ``streamlb
    --help`` and heads its own ``--help``."""
    return sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")


def _instances(text: str) -> tuple[int, int]:
    """``FROM:TO`` of ``--rescale``: two instance counts >= 1."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FROM:TO, two instance counts such as 2:6, got {text!r}") \
            from None
    if a < 1 or b < 1 or a == b:
        raise argparse.ArgumentTypeError(f"FROM and TO must be different instance counts >= 1, got {text!r}")
    return a, b


def _balancer(name: str) -> str:
    """A balancer registered under ``streamlb.balancers`` (built-in or installed)."""
    from ..balancer import available_balancers

    names = available_balancers()
    if name not in names:
        raise argparse.ArgumentTypeError(f"unknown balancer {name!r}; valid balancers are {', '.join(sorted(names))}")
    return name
