"""Sphinx configuration: the Markdown pages (myst-parser) and an API reference (autodoc, numpydoc).

Build with ``tox -e docs`` or ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""
from __future__ import annotations

import streamlb

project = "streamlb"
author = "streamlb developers"
release = version = streamlb.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "numpydoc",
]

root_doc = "index"
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Links such as [x](migration.md#lazy-pulls) in the pages: anchors for headings down to ###.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"

# numpydoc renders the sections; members are listed by autodoc, not by numpydoc's tables
# (which would document them twice).
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set[str] = set()
numpydoc_xref_param_type = False

html_theme = "alabaster"
html_title = f"streamlb {release}"


def _module_sections_as_rubrics(app, what, name, obj, options, lines):
    """numpydoc renders the sections (Examples, ...) of a function or class docstring as
    rubrics but leaves a module's docstring as it is, where ``Examples`` / ``--------`` would
    become a section of the page (and an ``examples`` label on every module page). Give module
    docstrings the same rubrics."""
    if what != "module":
        return
    out, i = [], 0
    while i < len(lines):
        title, under = lines[i].strip(), lines[i + 1].strip() if i + 1 < len(lines) else ""
        if title and under and set(under) == {"-"} and len(under) >= len(title):
            out += [f".. rubric:: {title}", ""]
            i += 2
        else:
            out.append(lines[i])
            i += 1
    lines[:] = out


def setup(app):
    # after numpydoc's own handler (priority 500)
    app.connect("autodoc-process-docstring", _module_sections_as_rubrics, priority=600)
