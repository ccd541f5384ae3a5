"""The job registry's jobs as the dashboard page lists them: an HTML table.

The registry (the scheduler plugin ``streamlb-jobs``, ``streamlb._jobs``) is on the same
layer as this package, and neither imports the other: the page finds it among the
scheduler's plugins by name (:func:`registry_of`) and reads its records with its ``list()``
method, plain dicts (the fields of ``job.json``, see docs/jobs.md). Nothing here changes a
job.
"""
from __future__ import annotations

import html
import time

from .._jobs import ACTIVE, NAME
from .._time import age as _age

__all__ = ["REGISTRY", "registry_of", "jobs_table_html", "submitted_names", "COLUMNS"]

#: The name the job registry has among the scheduler's plugins.
REGISTRY = NAME
COLUMNS = ("job", "status", "uptime", "parallelism", "records/s", "last checkpoint", "restarts", "recoveries",
           "error or reason")
#: Colour of a status in the table (others: the text's).
STATUS_COLOURS = {"running": "#2ca02c", "restarting": "#ff7f0e", "starting": "#1f77b4", "stopping": "#1f77b4",
                  "failed": "#d62728"}
_NOTE_CHARS = 300


def submitted_names(records: list[dict]) -> dict[str, str]:
    """The id of the ``Job`` each record's driver runs (what the balancer plugin knows it
    by) -> the submitted job's name."""
    return {(r.get("info") or {}).get("run"): r.get("name") for r in records if (r.get("info") or {}).get("run")}


def registry_of(scheduler):
    """The scheduler's job registry plugin, or None."""
    plugins = getattr(scheduler, "plugins", None) or {}
    return plugins.get(REGISTRY)


def _row(rec: dict, now: float) -> list[str]:
    info = rec.get("info") or {}
    live = rec.get("status") in ("running", "stopping")
    par = ", ".join(f"{k}={v}" for k, v in (info.get("parallelism") or {}).items()) or "-"
    rate = info.get("records_per_s")
    cp = info.get("checkpoint") or {}
    last = (f"{cp.get('id')} ({_age(now - cp['completed'])} ago)" if cp.get("completed")
            else "none yet" if rec.get("checkpoint") else "no checkpoints")
    note = rec.get("error") or (rec.get("reason") if rec.get("status") in ACTIVE else None) or ""
    if len(note) > _NOTE_CHARS:
        note = note[:_NOTE_CHARS] + "..."
    uptime = rec.get("uptime") if live else None     # a restarting job's is its lost driver's
    return [f"{rec.get('name')} ({rec.get('id')})", str(rec.get("status")), _age(uptime), par,
            f"{rate:,.0f}" if live and rate is not None else "-", last, str(rec.get("restarts", 0)),
            str(info.get("recoveries", 0)), note]


def jobs_table_html(records: list[dict], now: float | None = None) -> str:
    """The records of the registry (its ``list()``) as a heading and an HTML table."""
    now = time.time() if now is None else now
    head = "<h3>jobs of the cluster's job registry</h3>"
    if not records:
        return head + "<p>No job was submitted to this cluster (<code>streamlb submit</code>).</p>"
    cell = "padding:2px 10px;text-align:left;border-bottom:1px solid #ddd"
    out = [head, '<table class="streamlb-jobs" style="border-collapse:collapse">', "<tr>"]
    out += [f'<th style="{cell}">{html.escape(c)}</th>' for c in COLUMNS]
    out.append("</tr>")
    for rec in records:
        values = _row(rec, now)
        colour = STATUS_COLOURS.get(values[1])
        out.append("<tr>")
        for i, v in enumerate(values):
            style = cell + (f";color:{colour};font-weight:bold" if i == 1 and colour else "")
            out.append(f'<td style="{style}">{html.escape(v)}</td>')
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)
