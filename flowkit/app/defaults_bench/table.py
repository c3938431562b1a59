"""The results of ``flowkit bench-defaults``: the cells on disk (one JSON file per task, model
and seed), their summary over seeds, the Markdown table and the verdict per target."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from flowkit.checkpoint import write_bytes_atomic

from ..common import markdown_table

__all__ = ["cell_path", "format_cell", "cells_table", "read_cells", "summarize", "verdicts",
           "write_cell"]

Cells = dict[str, dict[str, dict[str, Any]]]
"""``cells[task][model]``: a record with ``nll`` and ``se`` (or an ``error``)."""

PAIRS = (("flowkit-maf", "zuko-maf"), ("flowkit-spline", "zuko-nsf"))
"""flowkit's default flows and the zuko flow each is compared with."""


def cell_path(folder: Path, task: str, model: str, seed: int) -> Path:
    """Where the cell of ``task``, ``model`` and ``seed`` is kept."""
    name = task.replace("|", "_given_").replace(":", "_").replace("+", "p")
    return folder / f"seed{seed}" / f"{name}__{model}.json"


def write_cell(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as JSON atomically, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (json.dumps(record, indent=1) + "\n").encode())


def read_cells(
    folder: Path, seeds: list[int] | None = None
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The cells under ``folder`` (of ``seeds``, or all): ``[task][model]`` -> the records of
    its seeds."""
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for path in sorted(folder.glob("seed*/*.json")):
        record = json.loads(path.read_text())
        if seeds is not None and record["seed"] not in seeds:
            continue
        record.pop("settings", None)
        cells.setdefault(record.pop("task"), {}).setdefault(record.pop("model"), []).append(record)
    return cells


def summarize(records: list[dict[str, Any]], key: str = "nll") -> dict[str, Any]:
    """One cell over its seeds: the mean of ``key`` and, with two seeds or more, its standard
    error over the seeds, ``s / sqrt(n)`` (with one seed: that seed's standard error over its
    test rows). A seed without a finite ``key`` makes the cell a failure (``nll`` infinite,
    ``error`` says which). Other numbers (``seconds``, ``outside_spline``) are averaged; the
    ``note`` of a seed whose training ended in an error is kept in ``notes``."""
    values = [r.get(key, math.inf) for r in records]
    out: dict[str, Any] = {"seeds": len(records)}
    for extra in ("seconds", "outside_spline"):
        if all(extra in r for r in records):
            out[extra] = sum(r[extra] for r in records) / len(records)
    notes = [f"seed {r['seed']}: {r['note']}" for r in records if "note" in r]
    if notes:
        out["notes"] = notes
    failed = [r.get("error", "no result") for r, v in zip(records, values, strict=True)
              if not math.isfinite(v)]
    if failed:
        out.update(nll=math.inf, error=f"{failed[0]} ({len(failed)} of {len(records)} seeds)")
        return out
    mean = sum(values) / len(values)
    if len(values) > 1:
        se = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
    else:
        se = records[0]["se"]
    out.update({key: mean, "se": se})
    return out


def format_cell(cell: dict[str, Any] | None) -> str:
    """A cell as the table shows it: ``nll ± se``, its error, or a dash when missing."""
    if cell is None:
        return "—"
    if not math.isfinite(cell.get("nll", math.inf)):
        return cell.get("error", "failed")
    return f"{cell['nll']:.3f} ± {cell['se']:.3f}"


def cells_table(cells: Cells, tasks: list[str], models: list[str]) -> str:
    """Held-out NLL per task (rows) and model (columns); the lowest of each row in bold."""
    rows = []
    for task in tasks:
        row = cells.get(task, {})
        values = {m: row[m]["nll"] for m in models if m in row and "nll" in row[m]}
        best = min(values.values(), default=None)
        out = [task.replace("|", "\\|")]  # a bare | would split the Markdown cell
        for m in models:
            text = format_cell(row.get(m))
            out.append(f"**{text}**" if m in values and values[m] == best else text)
        rows.append(out)
    return markdown_table(["task", *models], rows) + "\n"


def _nll(row: dict[str, dict[str, Any]], model: str) -> float | None:
    return row[model]["nll"] if model in row and "nll" in row[model] else None


def verdicts(cells: Cells, tasks: list[str]) -> list[str]:
    """The targets, task by task: each flowkit default against zuko's same kind of flow (lower,
    or within zuko's standard error: flowkit's own spread does not count, a huge one would
    excuse a huge NLL), the better flowkit flow against the better scikit-learn model (lower),
    and for the spline the share of test rows that reach some spline layer outside its
    interval. Ends with the count of targets met."""
    lines, met, total = [], 0, 0
    for task in tasks:
        row = cells.get(task, {})
        ok = []
        for ours, theirs in PAIRS:
            a, b = _nll(row, ours), _nll(row, theirs)
            if a is None or b is None:
                continue
            good = not math.isfinite(b) or a <= b + row[theirs]["se"]
            failed = f" ({theirs} failed)" if not math.isfinite(b) else ""
            ok.append(f"{ours} vs {theirs}: {'yes' if good else 'NO'}{failed}")
            met, total = met + good, total + 1
        sk = [v for m in ("gmm", "kde") if (v := _nll(row, m)) is not None]
        ours = [v for m in ("flowkit-maf", "flowkit-spline") if (v := _nll(row, m)) is not None]
        if sk and ours:
            good = min(ours) < min(sk)
            ok.append(f"flowkit vs best sklearn: {'yes' if good else 'NO'}")
            met, total = met + good, total + 1
        for m in ("flowkit-maf", "flowkit-spline"):
            for note in row.get(m, {}).get("notes", []):
                ok.append(f"{m} {note}, scored with its best validation's weights")
        share = row.get("flowkit-spline", {}).get("outside_spline")
        if share is not None:
            ok.append(f"spline tails: {100 * share:.2f}% of test rows")
        if ok:
            lines.append(f"- {task}: " + "; ".join(ok))
    if total:
        lines.append(f"\ntargets met: {met} of {total} comparisons")
    return lines
