"""The models of ``flowkit bench-defaults`` and how each is trained and scored: flowkit's flows
by :func:`flowkit.fit` with its defaults, zuko's by a loop with the same budget, split and
stopping rule, scikit-learn's by cross-validation; one (task, model, seed) cell at a time."""

from __future__ import annotations

import argparse
import inspect
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import flowkit
from flowkit.data import sample_toy, toy_entropy
from flowkit.flows import spline_edge_shares
from flowkit.train import (
    DivergenceError,
    DivergenceWarning,
    NonFiniteLossError,
    default_batch_size,
)

from ..common import mean_se
from ..sklearn_compare import fit_model as fit_sklearn
from .suite import UNIT_SCALE, UNIT_SHIFT, Task

__all__ = ["FLOWS", "MODELS", "cell", "settings", "target"]

_LU_LINEAR = inspect.signature(flowkit.MAF).parameters["lu_linear"].default
"""``flowkit.MAF``'s default ``lu_linear``, recorded in every flowkit cell's settings."""

FLOWS = ("flowkit-maf", "flowkit-spline", "zuko-maf", "zuko-nsf")
MODELS = (*FLOWS, "gmm", "kde")
ZUKO_LR = 1e-3
"""zuko's side: Adam at a constant 1e-3, the rate of zuko's examples (zuko has no training
function, so no default of its own)."""

LogProb = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


def _tensors(task: Task, part: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    x = torch.from_numpy((task.train, task.valid, task.test)[part])
    c = None if task.context is None else torch.from_numpy(task.context[part])
    return x, c


def _pair(x: torch.Tensor, c: torch.Tensor | None) -> Any:
    return x if c is None else (x, c)


class _Scored:
    """A fitted flowkit flow as the benchmark scores it: ``log_prob(x, c)``, and for splines the
    share of the test points that reach a spline layer outside its interval ``[-B, B]`` (where
    the layer is the identity and cannot shape them), the largest over the layers. ``note``
    says why training ended early, when it did."""

    def __init__(self, flow: flowkit.Flow, note: str | None = None):
        self.flow, self.note = flow, note

    def __call__(self, x: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        return self.flow.log_prob(x) if c is None else self.flow.log_prob(x, c)

    def outside(self, x: torch.Tensor, c: torch.Tensor | None) -> float | None:
        """The largest share of rows that a spline layer receives outside its interval; None
        without spline layers (:func:`flowkit.flows.spline_edge_shares`)."""
        return max(spline_edge_shares(self.flow, x, c), default=None)


_SET_BY_THE_BENCHMARK = {
    "--flow-options": ("features", "context_features", "transformer"),
    "--fit-options": ("valid", "steps", "batch_size", "valid_every", "early_stopping_patience",
                      "restore_best", "seed", "device", "progress"),
}


def _options(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--flow-options`` and ``--fit-options`` (empty when not given), refusing the keywords
    the benchmark sets itself (its budget and stopping rule are options of their own)."""
    given = {"--flow-options": vars(args).get("flow_options") or {},
             "--fit-options": vars(args).get("fit_options") or {}}
    for option, keys in _SET_BY_THE_BENCHMARK.items():
        if taken := sorted(set(given[option]) & set(keys)):
            raise ValueError(f"'{option}' sets {', '.join(taken)}, which the benchmark sets "
                             "(use --models, --steps, --batch-size, --patience, ...)")
    return given["--flow-options"], given["--fit-options"]


def _batch_size(rows: int, args: argparse.Namespace) -> int:
    """Every flow's batch size: ``--batch-size`` capped by the training rows, or by default
    the one :func:`flowkit.fit` chooses for them."""
    return default_batch_size(rows) if args.batch_size is None else min(args.batch_size, rows)


def _fit_flowkit(task: Task, transformer: str, steps: int, seed: int,
                 args: argparse.Namespace) -> _Scored:
    """``flowkit.MAF`` with its defaults (but ``transformer``), trained by ``flowkit.fit`` with
    its defaults: validation once per epoch (unless ``--valid-every``); the run stops after
    ``--patience`` validations without a new best and ends with the best weights."""
    x, c = _tensors(task, 0)
    torch.manual_seed(seed)
    flow_options, fit_options = _options(args)
    flow = flowkit.MAF(x.shape[1], context_features=0 if c is None else c.shape[1],
                       transformer=transformer, **flow_options)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DivergenceWarning)  # noted below
            history = flowkit.fit(
                flow, _pair(x, c), valid=_pair(*_tensors(task, 1)), steps=steps,
                batch_size=_batch_size(len(x), args), valid_every=args.valid_every,
                early_stopping_patience=args.patience or None, restore_best=True,
                seed=seed, device="cpu", progress=False, **fit_options)
    except (NonFiniteLossError, DivergenceError) as e:
        # fit left the model with its best validation's weights: scored as zuko's side is
        return _Scored(flow, f"{type(e).__name__} at step {e.step}")
    if history.diverged_step is not None:  # ended there with its best validation's weights
        return _Scored(flow, f"diverged at step {history.diverged_step}")
    return _Scored(flow)


def _fit_zuko(task: Task, kind: str, steps: int, seed: int, args: argparse.Namespace) -> LogProb:
    """zuko's ``MAF`` or ``NSF`` with its defaults, trained as ``flowkit.fit`` trains: each
    epoch the training rows in a fresh random order, ``N // batch`` batches; validation at the
    end of each epoch (or every ``--valid-every`` steps) and at the last step; the best
    validation's weights at the end, stopping after ``--patience`` validations without a new
    best."""
    import zuko

    x, c = _tensors(task, 0)
    xv, cv = _tensors(task, 1)
    torch.manual_seed(seed)
    build = zuko.flows.MAF if kind == "maf" else zuko.flows.NSF
    flow = build(x.shape[1], context=0 if c is None else c.shape[1])

    def log_prob(x: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        return flow(c).log_prob(x)

    optimizer = torch.optim.Adam(flow.parameters(), lr=ZUKO_LR)
    generator = torch.Generator().manual_seed(seed)
    batch = _batch_size(len(x), args)
    per_epoch = len(x) // batch
    every = args.valid_every or per_epoch
    best, best_state, order = math.inf, None, torch.empty(0, dtype=torch.long)
    bad = 0  # validations since the best
    for step in range(steps):
        epoch_step = step % per_epoch
        if epoch_step == 0:
            order = torch.randperm(len(x), generator=generator)
        rows = order[epoch_step * batch : (epoch_step + 1) * batch]
        loss = -log_prob(x[rows], None if c is None else c[rows]).mean()
        if not torch.isfinite(loss):
            break  # keep the best validated weights, as fit does when a run fails
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % every == 0 or step + 1 == steps:
            with torch.no_grad():
                valid = -log_prob(xv, cv).mean().item()
            if valid < best:
                best, bad = valid, 0
                best_state = {k: v.clone() for k, v in flow.state_dict().items()}
            else:
                bad += 1
                if bad == args.patience:
                    break
    if best_state is not None:
        flow.load_state_dict(best_state)
    return log_prob


def _fit_sklearn(task: Task, kind: str, seed: int, args: argparse.Namespace) -> LogProb:
    """GaussianMixture or KernelDensity, cross-validated on the training and validation rows;
    one per label for a conditional task."""
    x = np.concatenate([task.train, task.valid]).astype(np.float64)
    if task.context is None:
        est, _ = fit_sklearn(kind, x, seed, args)
        return lambda x, c: torch.from_numpy(est.score_samples(x.double().numpy()))
    labels = np.concatenate(task.context[:2])[:, 0]
    per_label = {y: fit_sklearn(kind, x[labels == y], seed, args)[0] for y in np.unique(labels)}

    def log_prob(x: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        assert c is not None
        out = np.empty(len(x))
        for y, est in per_label.items():
            rows = (c[:, 0] == y).numpy()
            out[rows] = est.score_samples(x[rows].double().numpy())
        return torch.from_numpy(out)

    return log_prob


def _fit(task: Task, model: str, seed: int, args: argparse.Namespace) -> LogProb:
    steps = args.real_steps if task.real else args.steps
    if model.startswith("flowkit-"):
        transformer = "affine" if model == "flowkit-maf" else "spline"
        return _fit_flowkit(task, transformer, steps, seed, args)
    if model.startswith("zuko-"):
        return _fit_zuko(task, model.removeprefix("zuko-"), steps, seed, args)
    return _fit_sklearn(task, model, seed, args)


def settings(task: Task | None, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The options a cell's result depends on, recorded with it so that a later run with other
    settings does not take it for its own: the split's sizes (toys), and for flows the budget
    and the stopping rule; for the checkerboard target (``task`` None), its steps and test
    rows."""
    if task is None:
        return {"target_steps": args.target_steps, "n_test": args.n_test}
    out: dict[str, Any] = {} if task.real else {"n_train": args.n_train, "n_test": args.n_test}
    if model in FLOWS:
        out |= {"steps": args.real_steps if task.real else args.steps,
                "batch_size": args.batch_size, "patience": args.patience,
                "valid_every": args.valid_every}
    if model.startswith("flowkit-"):  # recorded when given (earlier cells have neither)
        flow_options, fit_options = _options(args)
        # lu_linear, given or not: it became MAF's default on 2026-11-26, and a cell of before
        # (which records no flow options) is not taken for one of today's flows (review 28)
        flow_options = {"lu_linear": _LU_LINEAR, **flow_options}
        out |= {k: v for k, v in (("flow_options", flow_options),
                                  ("fit_options", fit_options)) if v}
    return out


def cell(task: Task, model: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Fit ``model`` on ``task`` and score its test rows: mean NLL in the task's original units
    and its standard error over the test rows, seconds, the spline's tail share."""
    start = time.perf_counter()
    log_prob = _fit(task, model, seed, args)
    seconds = time.perf_counter() - start
    x, c = _tensors(task, 2)
    with torch.no_grad():
        nll = -torch.cat([log_prob(xb, None if c is None else c[i : i + len(xb)])
                          for i, xb in zip(range(0, len(x), 4096), x.split(4096), strict=True)])
    finite = torch.isfinite(nll)
    mean, se = mean_se(nll[finite] if finite.any() else nll)
    out: dict[str, Any] = {"nll": mean - task.log_jacobian, "se": se, "seconds": seconds}
    if isinstance(log_prob, _Scored):
        if (share := log_prob.outside(x, c)) is not None:
            out["outside_spline"] = share
        if log_prob.note is not None:
            out["note"] = log_prob.note
    if not finite.all():
        out["error"] = f"{int((~finite).sum())} test rows with infinite NLL"
        out["nll"] = math.inf
    return out


def target(units: bool, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """KL of ``MAF(2, transformer="spline")`` trained by ``fit``'s defaults for
    ``--target-steps`` steps on fresh checkerboard samples, in own units or after x100+1000
    (then reported back in own units)."""
    shift = torch.tensor([UNIT_SHIFT, 0.0]) if units else torch.zeros(2)
    scale = torch.tensor([UNIT_SCALE, 1.0]) if units else torch.ones(2)

    def sample(n: int, generator: torch.Generator) -> torch.Tensor:
        return sample_toy("checkerboard", n, generator=generator) * scale + shift

    torch.manual_seed(seed)
    flow = flowkit.MAF(2, transformer="spline")
    start = time.perf_counter()
    flowkit.fit(flow, sample, steps=args.target_steps, seed=seed, device="cpu", progress=False)
    seconds = time.perf_counter() - start
    test = sample_toy("checkerboard", args.n_test, seed=seed + 1) * scale + shift
    with torch.no_grad():
        mean, se = mean_se(-flow.log_prob(test))
    nll = mean - float(torch.log(scale).sum())
    return {"nll": nll, "se": se, "kl": nll - toy_entropy("checkerboard"), "seconds": seconds}
