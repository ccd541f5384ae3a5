"""Figures without pyplot: a :class:`matplotlib.figure.Figure` draws and saves with no
backend chosen, so plotting from streamlb never changes the backend of a notebook or an
application (``matplotlib.use`` is a process-wide switch)."""
from __future__ import annotations

import os


def figure(**kwargs):
    """A new Figure (``kwargs`` as for :class:`matplotlib.figure.Figure`). matplotlib is
    in the ``plot`` extra: without it, an ImportError says how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "plotting needs matplotlib, which streamlb installs with its 'plot' extra: "
            "pip install \"streamlb[plot]\" (or pip install matplotlib)"
        ) from exc
    return Figure(**kwargs)


def colours(name: str = "tab10"):
    """A matplotlib colormap by name, without pyplot."""
    import matplotlib

    return matplotlib.colormaps[name]


def save(fig, path: str | None, dpi: int = 110):
    """Write ``fig`` to ``path`` (its folder made if missing) when a path is given;
    return the figure."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=dpi)
    return fig
