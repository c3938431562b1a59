"""The robustness sweep of ``flowkit toy --sweep``: every dataset x flow x transformer at
several constant learning rates, checking that the loss and the parameters stay finite."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from flowkit.data import TOY_DATASETS, sample_toy
from flowkit.train import NonFiniteLossError, fit, resolve_device

from .experiment2d import (
    FLOWS,
    TRANSFORMERS,
    FlowSettings,
    build_flow,
    check_selection,
    fmt,
    run_label,
)

__all__ = ["SWEEP_LRS", "robustness_sweep", "sweep_table"]

SWEEP_LRS = (1e-4, 1e-3, 1e-2)
"""The learning rates of the sweep."""


def robustness_sweep(
    datasets: Sequence[str] = TOY_DATASETS,
    flows: Sequence[str] = tuple(FLOWS),
    transformers: Sequence[str] = TRANSFORMERS,
    lrs: Sequence[float] = SWEEP_LRS,
    settings: FlowSettings | None = None,
    *,
    device: str | torch.device = "auto",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Train every combination for ``settings.steps`` steps at a constant learning rate and
    check for NaN/Inf.

    A run fails if the fit loop raises :class:`~flowkit.train.NonFiniteLossError` (a loss that
    is not finite) or if a parameter is not finite at the end.

    Returns:
        One record per run: ``dataset, flow, transformer, lr``, ``finite`` (bool),
        ``last_loss`` (mean of the last 10 losses; None on failure) and ``error`` (None, or
        what was not finite).
    """
    check_selection("datasets", datasets, TOY_DATASETS, flows, transformers)
    settings = settings or FlowSettings()
    dev = resolve_device(device)
    records = []
    for dataset in datasets:
        for flow in flows:
            for transformer in transformers:
                for lr in lrs:
                    model = build_flow(flow, transformer, settings, seed=seed)
                    record: dict[str, Any] = {
                        "dataset": dataset,
                        "flow": flow,
                        "transformer": transformer,
                        "lr": lr,
                        "finite": True,
                        "last_loss": None,
                        "error": None,
                    }
                    try:
                        history = fit(
                            model,
                            lambda n, g, name=dataset: sample_toy(name, n, generator=g),
                            steps=settings.steps,
                            batch_size=settings.batch_size,
                            lr=lr,
                            seed=seed,
                            device=dev,
                            progress=False,
                        )
                        record["last_loss"] = statistics.fmean(history.train_loss[-10:])
                    except NonFiniteLossError as e:
                        record["finite"], record["error"] = False, str(e)
                    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
                    if bad:
                        record["finite"] = False
                        record["error"] = record["error"] or f"non-finite parameters: {bad}"
                    records.append(record)
    return records


def sweep_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of :func:`robustness_sweep` records, with a count line first."""
    failed = sum(not r["finite"] for r in records)
    lines = [
        f"{len(records)} runs, {failed} with a non-finite loss or parameter.",
        "",
        "| dataset | flow | lr | finite | mean of last 10 losses |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['dataset']} | {run_label(r['flow'], r['transformer'])} | {r['lr']:g} | "
        f"{'yes' if r['finite'] else 'NO: ' + r['error']} | {fmt(r['last_loss'])} |"
        for r in records
    ]
    return "\n".join(lines) + "\n"
