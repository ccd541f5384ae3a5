"""What a running job shows outside itself: Prometheus series on the scheduler's
``/metrics`` and a page on the Dask dashboard. Both read the balancer plugin's view of its
jobs (load reports per window, routing tables, history); both are attached when the plugin
starts on a scheduler and detached when it closes. The page also lists the jobs of the
scheduler's job registry when there is one (``_jobs_table``), found among the scheduler's
plugins by name: ``streamlb._jobs`` and this package never import each other. A missing optional dependency (bokeh,
prometheus_client) leaves that part out, never the plugin."""
from __future__ import annotations

import logging

logger = logging.getLogger("streamlb.observe")


def attach(plugin, scheduler) -> None:
    """Serve ``plugin``'s jobs on ``scheduler``'s HTTP server."""
    from . import _dashboard, _prometheus

    for part in (_prometheus, _dashboard):
        try:
            part.attach(plugin, scheduler)
        except Exception:       # observability must never stop the balancer
            logger.exception("streamlb: could not attach %s", part.__name__)


def detach(plugin) -> None:
    from . import _dashboard, _prometheus

    for part in (_prometheus, _dashboard):
        try:
            part.detach(plugin)
        except Exception:
            logger.exception("streamlb: could not detach %s", part.__name__)
