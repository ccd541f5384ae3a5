"""The bokeh document of the streamlb dashboard page.

When the scheduler keeps a job registry (``streamlb-jobs``), the page opens with its jobs,
one row each (``_jobs_table``). Then one section per job the balancer plugin knows, one
panel per keyed operator:

- records applied per instance, per load window;
- imbalance per window (records of the busiest instance over the mean) and its floor (what
  moving key groups can reach while one key group carries more than 1/n of the load);
- latency p50 and p99 per window, from the instances' latency histograms added up;
- the routing table as a heat map, key groups across, instances up: a cell is coloured
  where the instance owns (or, for a split key, helps with) the key group, by the records
  the group received in the last window.

Migration and split epochs, and the autoscaler's rescales, are vertical lines on the time
axes, at the time they started. Everything is read from the plugin (``plugin.jobs``) at each refresh,
once per load window, on the scheduler's event loop where the plugin changes it, so no
lock is needed and nothing is written back.
"""
from __future__ import annotations

import html
import time

import numpy as np
import pandas as pd

from .. import latency as _latency
from ..keygroups import key_group_of
from ._jobs_table import jobs_table_html, registry_of, submitted_names

SHOWN_WINDOWS = 600         # windows on the time axes: 10 minutes at the default 1 s window
MARKS = {"migration": "#d62728", "split": "#ff7f0e", "autoscale": "#2ca02c"}   # colour of each kind's lines
TOOLS = "pan,xwheel_zoom,box_zoom,reset,save"


def epoch_kind(entry: dict) -> str:
    """What an entry of a job's history did: ``migration``, ``split`` or its ``kind``."""
    if "kind" in entry:
        return str(entry["kind"])
    return "split" if entry.get("strategy") == "split" else "migration"


def job_events(job) -> list[dict]:
    """The plugin's epochs of ``job`` (migrations and splits) and the autoscaler's decisions
    that rescaled an operator, as history entries."""
    decisions = job.autoscale.get("decisions", ())
    return list(job.control.history) + [d for d in decisions if d.get("status") == "done"]


def window_series(rows: list, quantiles: dict) -> dict:
    """Time series of trace rows (see ``Window.trace_row``): window start (ms), records
    applied per instance (windows × instances, NaN where an instance did not exist), p50
    and p99 latency (ms). ``quantiles`` caches the percentiles by window start."""
    t = np.array([r[0] for r in rows], dtype=np.float64)
    n = max((len(r[6]) for r in rows), default=0)
    records = np.full((len(rows), n), np.nan)
    p50, p99 = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
    for i, r in enumerate(rows):
        records[i, :len(r[6])] = r[6]
        if r[0] not in quantiles:
            quantiles[r[0]] = (_latency.quantile(r[5], 0.5), _latency.quantile(r[5], 0.99))
        p50[i], p99[i] = quantiles[r[0]]
    for old in [w for w in quantiles if len(t) and w < t[0]]:
        del quantiles[old]
    return {"t": t * 1000.0, "records": records, "p50": p50, "p99": p99}


def routing_image(table, loads) -> np.ndarray:
    """Instances × key groups: the records of the key group where the instance owns it or
    helps with a split key of it, NaN elsewhere."""
    G, n = table.key_groups, table.parallelism
    loads = np.zeros(G) if loads is None else np.asarray(loads, dtype=np.float64)
    image = np.full((n, G), np.nan)
    image[table.owners, np.arange(G)] = loads
    for key, helpers in table.splits:
        g = key_group_of(key, G)
        image[[h for h in helpers if h < n], g] = loads[g]
    return image


class OperatorPanel:
    """The four plots of one keyed operator."""

    def __init__(self, name: str) -> None:
        from bokeh.layouts import column, row
        from bokeh.models import (BasicTicker, ColorBar, ColumnDataSource, DataRange1d, Div, HoverTool,
                                  LinearColorMapper, Range1d)
        from bokeh.palettes import Viridis256
        from bokeh.plotting import figure

        self.name = name
        self.seen = None
        self.quantiles: dict = {}
        self.title = Div(text=f"<h4>operator {html.escape(name)}</h4>", sizing_mode="stretch_width")
        self.records = ColumnDataSource({"xs": [], "ys": [], "instance": [], "color": []})
        self.imbalance = ColumnDataSource({"t": [], "imbalance": [], "floor": []})
        self.latency = ColumnDataSource({"t": [], "p50": [], "p99": []})
        self.epochs = ColumnDataSource({"x": [], "kind": [], "color": [], "epoch": [], "groups": []})
        self.heat = ColumnDataSource({"image": [np.full((1, 1), np.nan)], "dw": [1], "dh": [1]})
        x_range = DataRange1d()
        common = dict(height=230, sizing_mode="stretch_width", tools=TOOLS, toolbar_location="above")

        def timeline(title: str, **kw):
            p = figure(title=title, x_axis_type="datetime", x_range=x_range, **common, **kw)
            p.vspan(x="x", color="color", source=self.epochs, line_width=2, line_alpha=0.7)
            p.add_tools(HoverTool(renderers=[p.renderers[-1]], tooltips=[
                ("epoch", "@epoch"), ("kind", "@kind"), ("key groups", "@groups")]))
            return p

        f_records = timeline("records per instance, per window")
        lines = f_records.multi_line(xs="xs", ys="ys", color="color", source=self.records, line_width=2)
        f_records.add_tools(HoverTool(renderers=[lines], tooltips=[("instance", "@instance"),
                                                                   ("records", "$y{0,0}")]))
        f_imb = timeline("imbalance (busiest instance / mean)", y_range=DataRange1d(start=0.9))
        f_imb.line(x="t", y="imbalance", source=self.imbalance, line_width=2, legend_label="records applied")
        f_imb.line(x="t", y="floor", source=self.imbalance, line_dash="dashed", color="gray",
                   legend_label="floor (hottest key group)")
        f_lat = timeline("latency (ms)", y_range=DataRange1d(start=0))
        f_lat.line(x="t", y="p50", source=self.latency, line_width=2, legend_label="p50")
        f_lat.line(x="t", y="p99", source=self.latency, line_width=2, color="#d62728", legend_label="p99")
        for p in (f_imb, f_lat):
            p.legend.location = "top_left"
            p.legend.background_fill_alpha = 0.5
            p.legend.click_policy = "hide"
        self.heat_y = Range1d(-0.5, 0.5)
        self.heat_x = Range1d(-0.5, 0.5)
        f_heat = figure(title="routing table: key groups × instances (records, last window)",
                        x_range=self.heat_x, y_range=self.heat_y, **common)
        mapper = LinearColorMapper(palette=Viridis256, low=0, nan_color=(0, 0, 0, 0))
        image = f_heat.image(image="image", x=-0.5, y=-0.5, dw="dw", dh="dh", source=self.heat,
                             color_mapper=mapper)
        f_heat.add_tools(HoverTool(renderers=[image], tooltips=[
            ("key group", "$x{0}"), ("instance", "$y{0}"), ("records", "@image{0,0}")]))
        f_heat.add_layout(ColorBar(color_mapper=mapper, width=8), "right")
        f_heat.xaxis.axis_label, f_heat.yaxis.axis_label = "key group", "instance"
        f_heat.grid.visible = False
        f_heat.yaxis.ticker = BasicTicker(min_interval=1, num_minor_ticks=0)
        self.layout = column(self.title, row(f_records, f_imb, sizing_mode="stretch_width"),
                             row(f_lat, f_heat, sizing_mode="stretch_width"), sizing_mode="stretch_width")

    def update(self, job) -> None:
        op = job.control.operators[self.name]
        trace = job.trace.get(self.name, ())
        history = job_events(job)
        seen = (trace[-1][0] if trace else None, op.table.epoch, len(history), op.table.parallelism, op.in_flight)
        if seen == self.seen:
            return
        self.seen = seen
        rows = list(trace)[-SHOWN_WINDOWS:]
        s = window_series(rows, self.quantiles)
        palette = _instance_colours(s["records"].shape[1])
        self.records.data = {"xs": [s["t"]] * s["records"].shape[1], "ys": list(s["records"].T),
                             "instance": [str(i) for i in range(s["records"].shape[1])], "color": palette}
        self.latency.data = {"t": s["t"], "p50": s["p50"], "p99": s["p99"]}
        imb = job.imbalance.get(self.name, [])[-SHOWN_WINDOWS:]
        self.imbalance.data = {"t": [w["window_start"] * 1000.0 for w in imb],
                               "imbalance": [w["imbalance"] for w in imb], "floor": [w["floor"] for w in imb]}
        since = rows[0][0] if rows else 0.0
        marks = [h for h in history if h.get("operator") == self.name and h.get("started", 0.0) >= since]
        self.epochs.data = {
            "x": [h["started"] * 1000.0 for h in marks], "kind": [epoch_kind(h) for h in marks],
            "color": [MARKS.get(epoch_kind(h), "gray") for h in marks],
            "epoch": [str(h.get("epoch", "")) for h in marks],
            "groups": [len(h.get("key_groups", ())) for h in marks],
        }
        image = routing_image(op.table, rows[-1][1] if rows else None)
        self.heat.data = {"image": [image], "dw": [image.shape[1]], "dh": [image.shape[0]]}
        self.heat_x.update(start=-0.5, end=image.shape[1] - 0.5)
        self.heat_y.update(start=-0.5, end=image.shape[0] - 0.5)
        last = imb[-1]["imbalance"] if imb else float("nan")
        self.title.text = (f"<h4>operator {html.escape(self.name)}</h4>{op.table.parallelism} instances, "
                           f"{op.table.key_groups} key groups, epoch {op.table.epoch}, {len(op.table.splits)} "
                           f"split keys, imbalance {last:.2f}{', migrating' if op.in_flight else ''}"
                           f"{event_time_text(job, self.name, op.table.parallelism)}")


def event_time_text(job, name: str, parallelism: int) -> str:
    """", watermark ... (lag), N late records" of a window operator; "" for others."""
    from .._time import MAX_TIME
    from ._totals import totals_of

    totals = totals_of(job)
    marks = [totals.watermarks.get((name, i)) for i in range(parallelism)] if totals is not None else []
    if not any(m is not None for m in marks):
        return ""
    low = min(m for m in marks if m is not None)
    late = sum(n for (op, _), n in totals.late.items() if op == name)
    if low >= MAX_TIME:
        return f", watermark: end of stream, {late} late records"
    lag = time.time() - low / 1e9
    return f", watermark {pd.Timestamp(low, unit='ns')} ({lag:.1f} s behind the wall clock), {late} late records"


def _instance_colours(n: int) -> list[str]:
    from bokeh.palettes import Category10_10, Category20_20

    palette = Category10_10 if n <= 10 else Category20_20
    return [palette[i % len(palette)] for i in range(n)]


class View:
    """One browser session's page: the registry's jobs (when there is a registry), then a
    section per job of the balancer plugin, rebuilt when jobs or operators come or go,
    refreshed in place otherwise."""

    def __init__(self, mount, doc) -> None:
        from bokeh.layouts import column
        from bokeh.models import Div

        self.mount = mount
        self.doc = doc
        self.shape = None
        self.panels: dict = {}
        self.headers: dict = {}
        self.registry_jobs = Div(sizing_mode="stretch_width")
        self.root = column(sizing_mode="stretch_width")
        self.empty = Div(text="<p>No streamlb job is registered with the balancer plugin.</p>")
        self.update()
        doc.add_root(self.root)
        window = getattr(mount.plugin, "window", None) or 1.0
        self.callback = doc.add_periodic_callback(self.update, max(200, int(1000 * float(window))))

    def update(self) -> None:
        from bokeh.models import Div

        plugin = self.mount.plugin
        if plugin is None:
            self.root.children = [Div(text="<p>The streamlb balancer plugin has closed.</p>")]
            self.doc.remove_periodic_callback(self.callback)
            return
        registry = registry_of(self.mount.scheduler)
        shape = (registry is not None, [(jid, list(job.control.operators)) for jid, job in plugin.jobs.items()])
        if shape != self.shape:
            self._rebuild(shape)
        names = {}
        if registry is not None:
            records = registry.list()
            self.registry_jobs.text = jobs_table_html(records)
            names = submitted_names(records)
        for jid, job in plugin.jobs.items():
            self.headers[jid].text = _job_header(jid, job, names.get(jid))
            for name in job.control.operators:
                self.panels[jid, name].update(job)

    def _rebuild(self, shape: tuple) -> None:
        from bokeh.models import Div

        self.shape = shape
        has_registry, balanced = shape
        self.panels = {(jid, name): self.panels.get((jid, name)) or OperatorPanel(name)
                       for jid, names in balanced for name in names}
        self.headers = {jid: self.headers.get(jid) or Div(sizing_mode="stretch_width") for jid, _ in balanced}
        children = []
        for jid, names in balanced:
            children.append(self.headers[jid])
            children += [self.panels[jid, name].layout for name in names]
        self.root.children = [self.registry_jobs] * has_registry + (children or [self.empty])


def _job_header(jid: str, job, submitted: str | None = None) -> str:
    history = job_events(job)
    kinds = {}
    for h in history:
        kinds[epoch_kind(h)] = kinds.get(epoch_kind(h), 0) + 1
    done = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none yet"
    legend = " ".join(f'<span style="color:{c}">&#9474; {k}</span>' for k, c in MARKS.items())
    refused = f", {len(job.refused)} refused" if job.refused else ""
    name = f" (submitted job {html.escape(submitted)})" if submitted else ""
    return (f"<h3>job {html.escape(str(jid))}{name}</h3>"
            f"<p>balancer <b>{html.escape(job.balancer_name)}</b>, migration <b>{html.escape(job.migration)}</b>; "
            f"epochs: {done}{refused}. Lines on the time axes: {legend}</p>")


def make_document(mount, in_template: bool, doc) -> None:
    """Bokeh ``FunctionHandler`` body: the page for one browser session."""
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    View(mount, doc)
    doc.title = "Dask: streamlb"
    doc.theme = BOKEH_THEME
    if in_template:
        doc.template = env.get_template("simple.html")
        doc.template_variables.update(mount.template_variables())
