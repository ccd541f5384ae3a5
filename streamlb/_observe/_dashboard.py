"""The streamlb page of the Dask dashboard, mounted on the scheduler's running dashboard.

Distributed serves its dashboard as one bokeh ``BokehTornado`` application inside the
scheduler's ``http_application``, built when the scheduler starts. The balancer plugin may
be registered long after that (``client.register_plugin``), so the page is added to that
running application: its bokeh applications get their routes (the ones ``BokehTornado``
gives each application it is built with) and an entry among the application's paths, which
is what ``/individual-plots.json`` and ``/sitemap.json`` list. The navigation bar's "More..."
menu is rendered from the scheduler's memoised template variables, so the page is added to
that list too. Bokeh has no public call for any of this; a bokeh that changes it makes
:func:`attach` raise, which the observability seam logs without stopping the plugin.

Two paths serve the same document: ``/streamlb`` inside Dask's page template (navigation
bar), and ``/individual-streamlb`` alone, as Dask's ``individual-*`` plots are, for panes
such as the JupyterLab extension.
"""
from __future__ import annotations

import functools
import logging

logger = logging.getLogger("streamlb.observe")

PAGE = "/streamlb"
INDIVIDUAL = "/individual-streamlb"
MENU_NAME = "Streamlb"

_pages: dict = {}          # plugin -> _Mount


def attach(plugin, scheduler) -> None:
    """Serve the page of ``plugin``'s jobs on ``scheduler``'s dashboard.

    Does nothing when bokeh is not installed or the scheduler runs no dashboard.
    """
    try:
        from bokeh.server.tornado import BokehTornado
    except ImportError:
        return
    app = next((a for a in getattr(getattr(scheduler, "http_application", None), "applications", ())
                if isinstance(a, BokehTornado)), None)
    if app is None:
        logger.debug("streamlb: the scheduler runs no bokeh dashboard; no streamlb page")
        return
    for old in [p for p, m in _pages.items() if m.app is app]:
        _pages.pop(old).remove()    # a plugin unregistered (that does not close it), then a new one
    mount = _Mount(plugin, scheduler, app)
    mount.add()
    _pages[plugin] = mount


def detach(plugin) -> None:
    """Take the page of ``plugin`` off the dashboard; open pages say the plugin closed."""
    mount = _pages.pop(plugin, None)
    if mount is not None:
        mount.remove()


class _Mount:
    """The page's routes, paths and menu entry on one running ``BokehTornado``.

    Documents read ``self.plugin`` at every refresh; None means the page was taken off.
    """

    def __init__(self, plugin, scheduler, app) -> None:
        self.plugin = plugin
        self.scheduler = scheduler
        self.app = app
        self.contexts: dict = {}
        self.rules: list = []
        self.menu_entry = {"url": PAGE.strip("/"), "name": MENU_NAME}

    def add(self) -> None:
        from bokeh.application import Application
        from bokeh.application.handlers.function import FunctionHandler
        from bokeh.server.contexts import ApplicationContext
        from bokeh.server.tornado import create_static_handler
        from bokeh.server.urls import per_app_patterns
        from bokeh.server.views.ws import WSHandler

        from ._dashboard_page import make_document

        routes = []
        for url, in_template in ((PAGE, True), (INDIVIDUAL, False)):
            application = Application(FunctionHandler(functools.partial(make_document, self, in_template)))
            ctx = ApplicationContext(application, io_loop=self.app.io_loop, url=url)
            app_routes = [(self.app.prefix + url + pattern, view, {"application_context": ctx})
                          for pattern, view in per_app_patterns]
            websocket = next(r for r, view, _ in app_routes if issubclass(view, WSHandler))
            for _, _, kwargs in app_routes:
                kwargs["bokeh_websocket_path"] = websocket
            routes += app_routes + [create_static_handler(self.app.prefix, url, application)]
            self.contexts[url] = ctx
        routers = (self.app.default_router, self.app.wildcard_router)
        before = [list(r.rules) for r in routers]
        self.app.add_handlers(r".*", routes)
        self.rules = [(r, rule) for r, old in zip(routers, before) for rule in r.rules if rule not in old]
        # the application's paths are what Dask lists (individual-plots.json, sitemap.json)
        # and where its cleanup job finds stale sessions
        self.app._applications.update(self.contexts)
        for ctx in self.contexts.values():
            ctx.run_load_hook()
        plots = self._menu()
        if plots is not None and self.menu_entry not in plots:
            plots.append(self.menu_entry)
            plots.sort(key=lambda d: d["name"])

    def remove(self) -> None:
        self.plugin = None
        for router, rule in self.rules:
            if rule in router.rules:
                router.rules.remove(rule)
        for url, ctx in self.contexts.items():
            if self.app._applications.get(url) is ctx:
                del self.app._applications[url]
                ctx.run_unload_hook()
        plots = self._menu()
        if plots is not None and self.menu_entry in plots:
            plots.remove(self.menu_entry)

    def _menu(self) -> list | None:
        """The list of the "More..." menu: every page of the dashboard renders the same one."""
        from distributed.dashboard.scheduler import template_variables

        return template_variables(self.scheduler).get("plots")

    def template_variables(self) -> dict:
        """What Dask's page template needs (navigation bar, menu)."""
        from distributed.dashboard.scheduler import template_variables

        return {"prefix": self.app.prefix + "/", **template_variables(self.scheduler)}
