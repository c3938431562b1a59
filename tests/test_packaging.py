"""setup.cfg declares every third-party package that flowkit imports."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _optional(tree: ast.Module) -> set[ast.AST]:
    """Import statements inside ``try: ... except ImportError`` (optional packages)."""
    optional: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            optional.update(n for stmt in node.body for n in ast.walk(stmt))
    return optional


def _imported_roots() -> dict[str, str]:
    """Top-level names imported in the flowkit package (optional imports aside) -> a file
    importing it."""
    roots: dict[str, str] = {}
    for path in sorted((ROOT / "flowkit").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        optional = _optional(tree)
        for node in ast.walk(tree):
            if node in optional:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                roots.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return roots


def _declared() -> set[str]:
    """Normalised distribution names in install_requires and every extra."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    for extra in config["options.extras_require"].values():
        lines += extra.splitlines()
    names = (re.match(r"[A-Za-z0-9_.-]+", line.strip()) for line in lines)
    return {_normalise(m.group()) for m in names if m}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_is_declared():
    distributions = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = []
    for root, where in _imported_roots().items():
        if root in sys.stdlib_module_names or root in ("flowkit", "__future__"):
            continue
        provided_by = {_normalise(d) for d in distributions.get(root, [root])}
        if not provided_by & declared:
            missing.append(f"{root} (imported in {where}, from {sorted(provided_by)})")
    assert not missing, f"not declared in setup.cfg: {missing}"
