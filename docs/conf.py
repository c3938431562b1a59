"""Sphinx configuration of the flowkit documentation.

Build (warnings are errors, as in ``make test``)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

Pages are Markdown (MyST); the API reference is generated from the docstrings (autodoc with
napoleon for the Google style). Nothing is downloaded at build time.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document the checkout, not an installed copy

from flowkit import __version__  # noqa: E402

project = "flowkit"
author = "the flowkit authors"
copyright = "the flowkit authors"
release = version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "notes", "README.md"]

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_mock_imports = ["gymnasium"]  # optional extra of the RL example
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "alabaster"
html_title = f"flowkit {release}"
html_theme_options = {
    "description": "Normalizing flows and autoregressive density models built on MADE",
    "fixed_sidebar": True,
}


# ----------------------------------------------------------------------- one page per object
# The top-level package re-exports the most used names (flowkit.Flow, flowkit.MAF, ...). Each is
# documented once, under its top-level name, so that references such as :class:`flowkit.Flow`
# in the docstrings resolve; a subpackage page skips it and links to it instead.

import flowkit  # noqa: E402

_TOP_LEVEL = [(name, getattr(flowkit, name)) for name in flowkit.__all__]
_current_module = [""]  # the module autodoc is documenting (its docstring comes first)


def _top_level_name(obj: object) -> str | None:
    return next((name for name, top in _TOP_LEVEL if top is obj), None)


def _link_top_level(app, what, name, obj, options, lines) -> None:
    if what != "module":
        return
    _current_module[0] = name
    shared = [_top_level_name(getattr(obj, n)) for n in getattr(obj, "__all__", ())]
    shared = [n for n in shared if n is not None]
    if name != "flowkit" and shared:
        links = ", ".join(f":obj:`flowkit.{n}`" for n in shared)
        lines.extend(["", f"Also here, documented at the top level: {links}.", ""])


def _skip_top_level(app, what, name, obj, skip, options) -> bool | None:
    if what == "module" and _current_module[0] != "flowkit" and _top_level_name(obj):
        return True
    return None


def _resolve_subpackage_path(app, env, node, contnode):
    """Resolve ``flowkit.train.fit`` (or ``flowkit.flows.Flow.log_prob``) to the top-level
    entry it is documented under (``flowkit.fit``, ``flowkit.Flow.log_prob``)."""
    if node.get("refdomain") != "py" or not node["reftarget"].startswith("flowkit."):
        return None
    parts = node["reftarget"].split(".")
    for i in range(len(parts), 1, -1):
        obj = _lookup(parts[:i])
        top = None if obj is None else _top_level_name(obj)
        if top is not None:
            target = ".".join(["flowkit", top, *parts[i:]])
            return env.get_domain("py").resolve_xref(
                env, node["refdoc"], app.builder, node["reftype"], target, node, contnode
            )
    return None


def _lookup(parts: list[str]) -> object | None:
    """The object at a dotted path such as ``flowkit.train.fit``, or None."""
    obj: object = importlib.import_module(parts[0])
    for i, name in enumerate(parts[1:], start=1):
        if not hasattr(obj, name):
            try:  # a submodule not imported by its package
                importlib.import_module(".".join(parts[: i + 1]))
            except ImportError:
                return None
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def setup(app) -> None:
    app.connect("missing-reference", _resolve_subpackage_path)
    app.connect("autodoc-process-docstring", _link_top_level)
    app.connect("autodoc-skip-member", _skip_top_level)
