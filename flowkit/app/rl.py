"""Soft actor-critic with a conditional IAF policy vs a Gaussian policy (flowkit rl).

Soft actor-critic (Haarnoja et al. 2018) needs from its policy exactly what an IAF gives in one
pass: a reparameterized action and the exact log-density of that action. Both policies draw a
pre-squash action u given the observation s and squash it into the action box [low, high]:

  "gaussian"  u = mu(s) + sigma(s) * eps, an MLP giving mu and log sigma
  "iaf"       u, log pi(u | s) = flow.sample_and_log_prob(context=s), with flow a flowkit.IAF
              whose MADEs read s as context (rational-quadratic spline layers by default: with
              the affine transformer and a one-dimensional action, as in Pendulum, an IAF is
              again a Gaussian)

Squashing a = c + r * tanh(u) (c, r the box's centre and half-width) changes the density by
the Jacobian: log pi(a | s) = log pi(u | s) - sum_j [log r_j + log(1 - tanh(u_j)^2)], with the
stable form log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)).

The rest is standard SAC: twin Q networks with Polyak-averaged targets, the entropy temperature
tuned towards -dim(A), uniform random actions for the first steps. Each (policy, seed) run
writes OUT/POLICY-seedS.json and its trained policy OUT/POLICY-seedS.pt; --resume skips
finished runs.

References:
  Haarnoja, Zhou, Abbeel & Levine, "Soft Actor-Critic: Off-Policy Maximum Entropy Deep
  Reinforcement Learning with a Stochastic Actor", ICML 2018; and "Soft Actor-Critic
  Algorithms and Applications", arXiv:1812.05905 (temperature tuning).
  Kingma et al., "Improved Variational Inference with Inverse Autoregressive Flow", 2016.
  Mazoure, Doan, Durand, Pineau & Hjelm, "Leveraging exploration in off-policy algorithms via
  normalizing flows", CoRL 2019 (flow policies in SAC).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from flowkit.checkpoint import write_bytes_atomic

from .common import add_threads_option, as_options, markdown_table, refuse_to_replace, use_threads
from .options import positive_float, positive_int
from .sac import SACConfig, train_sac
from .sac_policies import POLICIES

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flowkit rl`` (the CLI adds ``--device``, ``--seed``, ``--out``
    and ``--quiet``)."""
    d, q = SACConfig(), QUICK
    parser.add_argument("--env", default=d.env_id,
                        help=f"gymnasium id, with a continuous (Box) action space (default: "
                             f"{d.env_id})")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES),
                        help="policies to compare (default: gaussian iaf)")
    parser.add_argument("--seeds", type=positive_int, default=None,
                        help=f"runs per policy, seeds SEED, SEED+1, ... (default: {SEEDS}; 1 "
                             "with --quick)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help=f"environment steps per run, more than the first {d.start_steps} "
                             f"of random actions (default: {d.steps}; {q.steps}, of which "
                             f"{q.start_steps} random, with --quick)")
    parser.add_argument("--hidden", type=positive_int, nargs="+", default=None,
                        help=f"hidden sizes of every network (default: "
                             f"{' '.join(map(str, d.hidden))}; "
                             f"{' '.join(map(str, q.hidden))} with --quick)")
    parser.add_argument("--flow-layers", type=positive_int, default=d.flow_layers,
                        help="autoregressive layers of the IAF policy")
    parser.add_argument("--flow-transformer", choices=["spline", "affine"],
                        default=d.flow_transformer, help="elementwise map of the IAF's layers")
    parser.add_argument("--lr", type=positive_float, default=d.lr, help="Adam learning rate")
    parser.add_argument("--eval-every", type=positive_int, default=None,
                        help=f"environment steps between evaluations (default: {d.eval_every}; "
                             f"{q.eval_every} with --quick)")
    parser.add_argument("--resume", action="store_true",
                        help="skip runs whose results exist (without it, an --out that holds "
                             "results of 'flowkit rl' is refused)")
    add_threads_option(parser, default=1)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: {q.steps} steps ({q.start_steps} random), one seed, "
                             f"{q.hidden[0]}-unit networks, batches of {q.batch_size}, "
                             f"{q.eval_episodes} evaluation episode; --seeds, --steps, --hidden "
                             "and --eval-every, when given, win")


SEEDS = 3
"""Default of ``--seeds``."""

QUICK = SACConfig(steps=150, start_steps=100, batch_size=32, hidden=(32, 32), eval_every=150,
                  eval_episodes=1)
"""Settings of ``--quick`` (a smoke test); the options given win over them."""

_OPTIONS = {"env_id": "--env", "steps": "--steps", "hidden": "--hidden", "lr": "--lr",
            "flow_layers": "--flow-layers", "layers": "--flow-layers",
            "eval_every": "--eval-every"}
"""The option of this command that sets each argument of SAC and its policies."""


def _finished_run(path: Path, config: SACConfig) -> dict[str, Any]:
    """The result in ``path``, if it was run with ``config``; else an error naming the first
    setting that differs and the option that sets it."""
    result = json.loads(path.read_text())
    wanted = json.loads(json.dumps(asdict(config)))
    for key, value in wanted.items():
        if result["config"].get(key) != value:
            option = _OPTIONS.get(key, "--quick")
            raise ValueError(
                f"--resume: '{path}' was run with {key} {result['config'].get(key)!r}, not "
                f"{value!r} (set by {option}); pass the same settings or pick another --out"
            )
    return result


def _summary(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary = {}
    for policy, runs in results.items():
        finals = [r["final_return"] for r in runs]
        curves = np.array([r["eval_returns"] for r in runs])
        summary[policy] = {
            "seeds": [r["seed"] for r in runs],
            "final_return_mean": statistics.fmean(finals),
            "final_return_std": statistics.stdev(finals) if len(finals) > 1 else None,
            "final_returns": finals,
            "eval_steps": runs[0]["eval_steps"],
            "eval_return_mean": curves.mean(0).tolist(),
            "eval_return_std": curves.std(0, ddof=1).tolist() if len(runs) > 1 else None,
            "wall_seconds_mean": statistics.fmean(r["wall_seconds"] for r in runs),
            "policy_parameters": runs[0]["policy_parameters"],
        }
    return summary


def _format_table(summary: dict[str, Any]) -> str:
    head = ["policy", "policy params", "seeds", "final return (mean ± std)", "per seed",
            "wall s/run"]
    rows = [
        [policy, f"{s['policy_parameters']:,}", f"{len(s['seeds'])}",
         f"{s['final_return_mean']:.1f}" + ("" if s["final_return_std"] is None
                                            else f" ± {s['final_return_std']:.1f}"),
         ", ".join(f"{v:.0f}" for v in s["final_returns"]), f"{s['wall_seconds_mean']:.0f}"]
        for policy, s in summary.items()
    ]
    return markdown_table(head, rows, right={1, 2, 3, 5})


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run SAC for every policy and seed; writes ``OUT/POLICY-seedS.json`` and the trained
    policy ``OUT/POLICY-seedS.pt`` (:func:`save_policy`) per run and
    ``OUT/summary.json``/``OUT/summary.md``; returns the summary (per policy: final evaluation
    return over seeds, mean evaluation curve, wall time)."""
    use_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = QUICK if args.quick else SACConfig()
    given = {"steps": args.steps, "eval_every": args.eval_every,
             "hidden": None if args.hidden is None else tuple(args.hidden)}
    base = replace(base, env_id=args.env, flow_layers=args.flow_layers,
                   flow_transformer=args.flow_transformer, lr=args.lr,
                   **{k: v for k, v in given.items() if v is not None})
    if base.steps <= base.start_steps:
        raise ValueError(
            f"'--steps' should be more than the {base.start_steps} steps of random actions "
            f"before the first update (with fewer, nothing is trained), got {base.steps}"
        )
    seeds = list(range(args.seed, args.seed + (args.seeds or (1 if args.quick else SEEDS))))
    runs = [(policy, seed) for policy in args.policies for seed in seeds]
    refuse_to_replace(out / "summary.json", args.resume)  # before any training
    finished: dict[tuple[str, int], dict[str, Any]] = {}
    for policy, seed in runs:
        path = out / f"{policy}-seed{seed}.json"
        for suffix in (".json", ".pt"):
            refuse_to_replace(path.with_suffix(suffix), args.resume)
        if args.resume and path.is_file():
            finished[policy, seed] = _finished_run(path, replace(base, policy=policy))
    results: dict[str, list[dict[str, Any]]] = {}
    for policy in args.policies:
        config = replace(base, policy=policy)
        for seed in seeds:
            path = out / f"{policy}-seed{seed}.json"
            if (policy, seed) in finished:
                result = finished[policy, seed]
            else:
                with as_options(_OPTIONS):
                    result = train_sac(config, seed, args.device, progress=not args.quiet,
                                       policy_path=path.with_suffix(".pt"))
                write_bytes_atomic(path, json.dumps(result, indent=2).encode())
            print(f"{policy} seed {seed}: final return {result['final_return']:.1f}, "
                  f"{result['wall_seconds']:.0f} s")
            results.setdefault(policy, []).append(result)
    summary = _summary(results)
    write_bytes_atomic(out / "summary.json", json.dumps(summary, indent=2).encode())
    table = _format_table(summary)
    write_bytes_atomic(out / "summary.md", (table + "\n").encode())
    print(table)
    return summary
