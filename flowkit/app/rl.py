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
import copy
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from flowkit.checkpoint import save_checkpoint, save_model
from flowkit.flows import IAF
from flowkit.train import resolve_device

from .common import mlp

__all__ = [
    "FlowPolicy",
    "GaussianPolicy",
    "SACConfig",
    "add_arguments",
    "run",
    "save_policy",
    "squash",
    "train_sac",
]

POLICIES = ("gaussian", "iaf")
_LOG_2 = math.log(2.0)


def squash(u: Tensor, log_prob_u: Tensor, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    r"""Map pre-squash actions into ``[low, high]`` and correct their log-density.

    ``a = c + r * tanh(u)`` with ``c = (high + low) / 2``, ``r = (high - low) / 2``, and
    :math:`\log\pi(a) = \log\pi(u) - \sum_j [\log r_j + 2(\log 2 - u_j - \mathrm{softplus}
    (-2u_j))]`, the last term being :math:`\log(1 - \tanh^2 u_j)` computed without
    cancellation for large ``|u_j|``.

    Args:
        u: ``(B, A)`` pre-squash actions.
        log_prob_u: ``(B,)`` their log-density.
        low, high: ``(A,)`` bounds of the action box.

    Returns:
        ``a``: ``(B, A)`` and ``log pi(a)``: ``(B,)``.
    """
    centre, half = (high + low) / 2, (high - low) / 2
    log_det = (half.log() + 2 * (_LOG_2 - u - F.softplus(-2 * u))).sum(-1)
    return centre + half * torch.tanh(u), log_prob_u - log_det


class GaussianPolicy(nn.Module):
    r"""``u ~ N(mu(s), diag sigma(s)^2)`` with :math:`\log\sigma \in (-5, 2)` (tanh-bounded).

    Args:
        obs_features: observation size.
        action_features: ``A``.
        hidden_features: hidden sizes of the MLP.
    """

    def __init__(self, obs_features: int, action_features: int, hidden_features: Sequence[int]):
        super().__init__()
        self.net = mlp([obs_features, *hidden_features, 2 * action_features], nn.ReLU)

    def _params(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        mu, raw = self.net(obs).chunk(2, -1)
        return mu, -1.5 + 3.5 * torch.tanh(raw / 3.5)

    def sample_and_log_prob(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``obs``: ``(B, S)`` -> reparameterized ``u``: ``(B, A)``, ``log pi(u|s)``: ``(B,)``."""
        mu, log_sigma = self._params(obs)
        eps = torch.randn_like(mu)
        log_prob = -(0.5 * eps**2 + log_sigma + 0.5 * math.log(2 * math.pi)).sum(-1)
        return mu + eps * log_sigma.exp(), log_prob

    def deterministic(self, obs: Tensor) -> Tensor:
        """The action of zero noise, ``mu(s)``: ``(B, A)``."""
        return self._params(obs)[0]


class FlowPolicy(nn.Module):
    """``u ~ IAF(context = s)``: a conditional :func:`flowkit.IAF` over the ``A`` action
    features; sampling and the log-density of the sample take one pass per layer.

    Args:
        obs_features: observation size (the flow's ``context_features``).
        action_features: ``A``.
        hidden_features: hidden sizes of each layer's MADE.
        layers: IAF layers.
        transformer: ``"spline"`` or ``"affine"``.
        transformer_kwargs: e.g. ``{"bins": 8, "bound": 4.0}`` for the spline.
    """

    def __init__(
        self,
        obs_features: int,
        action_features: int,
        hidden_features: Sequence[int],
        layers: int = 2,
        transformer: str = "spline",
        transformer_kwargs: dict | None = None,
    ):
        super().__init__()
        self.flow = IAF(
            action_features,
            layers=layers,
            hidden_features=hidden_features,
            context_features=obs_features,
            transformer=transformer,
            transformer_kwargs=transformer_kwargs,
        )

    def sample_and_log_prob(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``obs``: ``(B, S)`` -> reparameterized ``u``: ``(B, A)``, ``log pi(u|s)``: ``(B,)``."""
        return self.flow.sample_and_log_prob(context=obs)

    def deterministic(self, obs: Tensor) -> Tensor:
        """The action of zero noise (the image of the base distribution's mode): ``(B, A)``."""
        zero = obs.new_zeros(obs.shape[0], self.flow.features)
        return self.flow.transform.inverse(zero, obs)[0]


def save_policy(policy: nn.Module, path: str | Path) -> None:
    """Save a trained policy atomically to ``path``, in a file read without unpickling objects.

    A :class:`FlowPolicy` is saved as its IAF with :func:`flowkit.save_model`:
    :func:`flowkit.load_model` rebuilds it, and ``flow.sample_and_log_prob(context=obs)`` draws
    pre-squash actions. A :class:`GaussianPolicy` has no flowkit constructor; its weights are
    saved in the same format without a config:
    ``flowkit.checkpoint.load_checkpoint(path).restore(policy)``.
    """
    if isinstance(policy, FlowPolicy):
        save_model(policy.flow, path)
    else:
        save_checkpoint(path, "model", model=policy)


class _QNetwork(nn.Module):
    def __init__(self, obs_features: int, action_features: int, hidden: Sequence[int]):
        super().__init__()
        self.net = mlp([obs_features + action_features, *hidden, 1], nn.ReLU)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        return self.net(torch.cat([obs, action], -1)).squeeze(-1)


@dataclass
class SACConfig:
    """Settings of one SAC run (defaults: the SAC paper's, except smaller networks, a larger
    learning rate and fewer steps, which suffice for Pendulum).

    Attributes:
        env_id: a gymnasium environment with box observations and actions.
        policy: ``"gaussian"`` or ``"iaf"``.
        steps: environment steps.
        start_steps: steps of uniformly random actions before the policy acts.
        batch_size: replay mini-batch; one update of every network per step after that.
        hidden: hidden sizes of the Q networks, the Gaussian MLP and each IAF layer's MADE.
        flow_layers: IAF layers; ``flow_transformer`` and ``flow_bins``/``flow_bound`` set
            their transformer.
        lr: Adam learning rate of every network and of the temperature.
        gamma: discount; tau: Polyak rate of the target Q networks.
        eval_every: steps between evaluations of ``eval_episodes`` episodes with the
            zero-noise action.
    """

    env_id: str = "Pendulum-v1"
    policy: str = "gaussian"
    steps: int = 10_000
    start_steps: int = 1_000
    batch_size: int = 256
    hidden: tuple[int, ...] = (128, 128)
    flow_layers: int = 2
    flow_transformer: str = "spline"
    flow_bins: int = 8
    flow_bound: float = 4.0
    lr: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005
    eval_every: int = 1_000
    eval_episodes: int = 5


class _Replay:
    """A ring buffer of transitions ``(s, a, r, s', terminated)`` as preallocated tensors."""

    def __init__(self, capacity: int, obs_features: int, action_features: int, seed: int,
                 device: torch.device):
        self.obs = torch.zeros(capacity, obs_features, device=device)
        self.action = torch.zeros(capacity, action_features, device=device)
        self.reward = torch.zeros(capacity, device=device)
        self.next_obs = torch.zeros(capacity, obs_features, device=device)
        self.terminated = torch.zeros(capacity, device=device)
        self.capacity, self.size, self.pos = capacity, 0, 0
        self.generator = torch.Generator(device).manual_seed(seed)

    def add(self, obs: np.ndarray, action: np.ndarray, reward: float, next_obs: np.ndarray,
            terminated: bool) -> None:
        i = self.pos
        self.obs[i], self.next_obs[i] = torch.as_tensor(obs), torch.as_tensor(next_obs)
        self.action[i] = torch.as_tensor(action)
        self.reward[i], self.terminated[i] = reward, float(terminated)
        self.pos, self.size = (i + 1) % self.capacity, min(self.size + 1, self.capacity)

    def sample(self, n: int) -> tuple[Tensor, ...]:
        idx = torch.randint(self.size, (n,), generator=self.generator,
                            device=self.generator.device)
        return (self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx],
                self.terminated[idx])


def _make_policy(config: SACConfig, obs_features: int, action_features: int) -> nn.Module:
    if config.policy == "gaussian":
        return GaussianPolicy(obs_features, action_features, config.hidden)
    if config.policy == "iaf":
        kwargs = (
            {"bins": config.flow_bins, "bound": config.flow_bound}
            if config.flow_transformer == "spline"
            else None
        )
        return FlowPolicy(obs_features, action_features, config.hidden, config.flow_layers,
                          config.flow_transformer, kwargs)
    raise ValueError(f"'policy' should be one of {', '.join(POLICIES)}, got {config.policy!r}")


def _as_batch(obs: np.ndarray, device: torch.device) -> Tensor:
    """One observation as a ``(1, S)`` float32 tensor on ``device``."""
    return torch.as_tensor(obs, dtype=torch.float32, device=device).reshape(1, -1)


def _evaluate(env: Any, policy: nn.Module, low: Tensor, high: Tensor, episodes: int,
              seed: int) -> float:
    """Mean return of ``episodes`` episodes with the zero-noise action."""
    returns = []
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                u = policy.deterministic(_as_batch(obs, low.device))
                a, _ = squash(u, u.new_zeros(1), low, high)
            obs, reward, terminated, truncated, _ = env.step(a[0].cpu().numpy())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return statistics.fmean(returns)


def train_sac(
    config: SACConfig,
    seed: int,
    device: str | torch.device = "cpu",
    progress: bool = False,
    policy_path: str | Path | None = None,
) -> dict[str, Any]:
    """Run SAC once; returns the evaluation curve, training episode returns and wall time.

    One environment step and one update of every network per step: with these small networks
    the CPU is usually faster than a GPU (``device="auto"`` picks CUDA if present). With
    ``policy_path``, the trained policy is saved there (:func:`save_policy`).

    Returns:
        ``{"eval_steps": [...], "eval_returns": [...], "episode_returns": [...],
        "final_return": float, "wall_seconds": float, "config": dict, "seed": int}``.
    """
    import gymnasium as gym  # the optional 'rl' extra

    device = resolve_device(device)
    torch.manual_seed(seed)
    try:
        env, eval_env = gym.make(config.env_id), gym.make(config.env_id)
    except gym.error.Error as e:
        raise ValueError(f"'env_id' {config.env_id!r} is not a gymnasium environment: {e}") from e
    env.action_space.seed(seed)
    obs_features = int(np.prod(env.observation_space.shape))
    action_features = int(np.prod(env.action_space.shape))
    low = torch.as_tensor(env.action_space.low, dtype=torch.float32, device=device)
    high = torch.as_tensor(env.action_space.high, dtype=torch.float32, device=device)

    policy = _make_policy(config, obs_features, action_features).to(device)
    q1, q2 = (
        _QNetwork(obs_features, action_features, config.hidden).to(device) for _ in range(2)
    )
    q1_target, q2_target = copy.deepcopy(q1), copy.deepcopy(q2)
    log_alpha = torch.zeros((), device=device, requires_grad=True)
    target_entropy = -float(action_features)
    policy_opt = torch.optim.Adam(policy.parameters(), lr=config.lr)
    q_opt = torch.optim.Adam([*q1.parameters(), *q2.parameters()], lr=config.lr)
    alpha_opt = torch.optim.Adam([log_alpha], lr=config.lr)
    replay = _Replay(config.steps, obs_features, action_features, seed, device)

    def act(obs_t: Tensor) -> tuple[Tensor, Tensor]:
        return squash(*policy.sample_and_log_prob(obs_t), low, high)

    def update() -> None:
        s, a, r, s2, term = replay.sample(config.batch_size)
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            a2, log_pi2 = act(s2)
            q_next = torch.min(q1_target(s2, a2), q2_target(s2, a2)) - alpha * log_pi2
            target = r + config.gamma * (1 - term) * q_next
        q_loss = F.mse_loss(q1(s, a), target) + F.mse_loss(q2(s, a), target)
        q_opt.zero_grad(set_to_none=True)
        q_loss.backward()
        q_opt.step()

        a_new, log_pi = act(s)
        q_new = torch.min(q1(s, a_new), q2(s, a_new))
        policy_loss = (alpha * log_pi - q_new).mean()
        policy_opt.zero_grad(set_to_none=True)
        policy_loss.backward()
        policy_opt.step()

        alpha_loss = -(log_alpha * (log_pi.detach() + target_entropy)).mean()
        alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        alpha_opt.step()

        with torch.no_grad():
            for net, tgt in ((q1, q1_target), (q2, q2_target)):
                for p, p_t in zip(net.parameters(), tgt.parameters(), strict=True):
                    p_t.lerp_(p, config.tau)

    eval_steps: list[int] = []
    eval_returns: list[float] = []
    episode_returns: list[float] = []
    obs, _ = env.reset(seed=seed)
    episode_return = 0.0
    t0 = time.perf_counter()
    for step in tqdm(range(1, config.steps + 1), disable=not progress, unit="step",
                     desc=f"{config.policy} seed {seed}", dynamic_ncols=True):
        if step <= config.start_steps:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                a, _ = act(_as_batch(obs, device))
            action = a[0].cpu().numpy()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        replay.add(obs, action, float(reward), next_obs, terminated)
        obs, episode_return = next_obs, episode_return + float(reward)
        if terminated or truncated:
            episode_returns.append(episode_return)
            obs, _ = env.reset()
            episode_return = 0.0
        if step > config.start_steps:
            update()
        if step % config.eval_every == 0 or step == config.steps:
            eval_steps.append(step)
            eval_returns.append(
                _evaluate(eval_env, policy, low, high, config.eval_episodes, 10_000 + seed)
            )
    wall_seconds = time.perf_counter() - t0
    if policy_path is not None:
        save_policy(policy, policy_path)
    return {
        "config": asdict(config),
        "seed": seed,
        "eval_steps": eval_steps,
        "eval_returns": eval_returns,
        "episode_returns": episode_returns,
        "final_return": eval_returns[-1],
        "wall_seconds": wall_seconds,
        "policy_parameters": sum(p.numel() for p in policy.parameters()),
        "device": str(device),
    }


# ----------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flowkit rl`` (the CLI adds ``--device``, ``--seed``, ``--out``
    and ``--quiet``)."""
    d = SACConfig()
    parser.add_argument("--env", default=d.env_id, help=f"gymnasium id (default: {d.env_id})")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES),
                        help="policies to compare (default: gaussian iaf)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="runs per policy, seeds SEED, SEED+1, ... (default: 3)")
    parser.add_argument("--steps", type=int, default=d.steps,
                        help=f"environment steps per run (default: {d.steps})")
    parser.add_argument("--hidden", type=int, nargs="+", default=list(d.hidden),
                        help="hidden sizes of every network (default: 128 128)")
    parser.add_argument("--flow-layers", type=int, default=d.flow_layers,
                        help="autoregressive layers of the IAF policy")
    parser.add_argument("--flow-transformer", choices=["spline", "affine"],
                        default=d.flow_transformer)
    parser.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    parser.add_argument("--eval-every", type=int, default=d.eval_every,
                        help="environment steps between evaluations")
    parser.add_argument("--resume", action="store_true", help="skip runs whose results exist")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default: 1)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 150 steps (100 random), one seed, 32-unit networks")


def _summary(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary = {}
    for policy, runs in results.items():
        finals = [r["final_return"] for r in runs]
        curves = np.array([r["eval_returns"] for r in runs])
        summary[policy] = {
            "seeds": [r["seed"] for r in runs],
            "final_return_mean": statistics.fmean(finals),
            "final_return_std": statistics.stdev(finals) if len(finals) > 1 else math.nan,
            "final_returns": finals,
            "eval_steps": runs[0]["eval_steps"],
            "eval_return_mean": curves.mean(0).tolist(),
            "eval_return_std": curves.std(0, ddof=1).tolist() if len(runs) > 1 else None,
            "wall_seconds_mean": statistics.fmean(r["wall_seconds"] for r in runs),
            "policy_parameters": runs[0]["policy_parameters"],
        }
    return summary


def _format_table(summary: dict[str, Any]) -> str:
    lines = [
        "| policy | policy params | seeds | final return (mean ± std) | per seed | wall s/run |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for policy, s in summary.items():
        per_seed = ", ".join(f"{v:.0f}" for v in s["final_returns"])
        lines.append(
            f"| {policy} | {s['policy_parameters']:,} | {len(s['seeds'])} | "
            f"{s['final_return_mean']:.1f} ± {s['final_return_std']:.1f} | {per_seed} | "
            f"{s['wall_seconds_mean']:.0f} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run SAC for every policy and seed; writes ``OUT/POLICY-seedS.json`` and the trained
    policy ``OUT/POLICY-seedS.pt`` (:func:`save_policy`) per run and
    ``OUT/summary.json``/``OUT/summary.md``; returns the summary (per policy: final evaluation
    return over seeds, mean evaluation curve, wall time)."""
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [args.seed] if args.quick else list(range(args.seed, args.seed + args.seeds))
    results: dict[str, list[dict[str, Any]]] = {}
    for policy in args.policies:
        config = SACConfig(
            env_id=args.env, policy=policy, steps=args.steps, hidden=tuple(args.hidden),
            flow_layers=args.flow_layers, flow_transformer=args.flow_transformer, lr=args.lr,
            eval_every=args.eval_every,
        )
        if args.quick:
            config.steps, config.start_steps, config.batch_size = 150, 100, 32
            config.hidden, config.eval_every, config.eval_episodes = (32, 32), 150, 1
        for seed in seeds:
            path = out / f"{policy}-seed{seed}.json"
            if args.resume and path.is_file():
                result = json.loads(path.read_text())
                if result["config"] != json.loads(json.dumps(asdict(config))):
                    raise ValueError(
                        f"--resume: '{path}' was run with other settings; pick another --out"
                    )
            else:
                result = train_sac(config, seed, args.device, progress=not args.quiet,
                                   policy_path=path.with_suffix(".pt"))
                path.write_text(json.dumps(result, indent=2))
            print(f"{policy} seed {seed}: final return {result['final_return']:.1f}, "
                  f"{result['wall_seconds']:.0f} s")
            results.setdefault(policy, []).append(result)
    summary = _summary(results)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    table = _format_table(summary)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    return summary
