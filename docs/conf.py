"""Sphinx configuration of the flowkit documentation.

Build (warnings are errors, as in ``make test``)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

Pages are Markdown (MyST); the API reference is generated from the docstrings (autodoc with
napoleon for the Google style). Nothing is downloaded at build time.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import time
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
    "sphinx-mathjax-offline",  # MathJax served from _static: formulas render offline
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
suppress_warnings = ["config.cache"]  # sphinx_gallery_conf holds functions: rebuilt each time
exclude_patterns = ["_build", "notes", "README.md", "gallery/*.ipynb", "gallery/*.py"]

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    # torch.nn.Module machinery that every model has: not part of flowkit's API
    "exclude-members": "extra_repr, training, dump_patches, call_super_init",
}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_mock_imports = ["gymnasium", "sbi"]  # optional extras: the RL example, sbi
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "furo"
html_title = f"flowkit {release}"

# ----------------------------------------------------------------------- the demo gallery
# sphinx-gallery runs the scripts of demos/ and renders them with their output and figures.
# The quick ones run at every build with a short budget (reset_argv); the MNIST, VAE and SAC
# demos need the MNIST data or minutes of training and are shown as code.

_RUNS = DOCS / "_build" / "gallery-runs"
_DEMO_ARGS = {
    "toy_density.py": ["--steps", "100", "--out", str(_RUNS / "toy")],
    "energy_vi.py": ["--steps", "100", "--out", str(_RUNS / "energy")],
}
_started: dict[str, float] = {}  # demo -> when it started (its figures are the newer PNGs)
_shown: set[Path] = set()


def _demo_argv(gallery_conf: dict, script_vars: dict) -> list[str]:
    name = Path(script_vars["src_file"]).name
    _started[name] = time.time()
    return _DEMO_ARGS.get(name, [])


def _png_scraper(block, block_vars, gallery_conf) -> str:
    """The figures of a demo: the PNG files it wrote (``flowkit.plot.save_figure``) since it
    started, each shown once, after the code block that wrote it."""
    from sphinx_gallery.scrapers import figure_rst

    name = Path(block_vars["src_file"]).name
    if name not in _DEMO_ARGS:
        return ""
    out = Path(_DEMO_ARGS[name][-1])
    images = []
    for png in sorted(out.glob("*.png")):
        if png in _shown or png.stat().st_mtime < _started.get(name, 0):
            continue
        _shown.add(png)
        target = Path(next(block_vars["image_path_iterator"]))
        shutil.copyfile(png, target)
        images.append(str(target))
    return figure_rst(images, gallery_conf["src_dir"])


sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "demos"),
    "gallery_dirs": "gallery",
    "filename_pattern": r"/(toy_density|energy_vi)\.py$",
    "reset_argv": _demo_argv,
    "image_scrapers": (_png_scraper,),
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "write_computation_times": False,
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
