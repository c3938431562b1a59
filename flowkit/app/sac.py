"""Soft actor-critic (Haarnoja et al. 2018) with a policy of :mod:`flowkit.app.sac_policies`.

Standard SAC: twin Q networks with Polyak-averaged targets, the entropy temperature tuned
towards ``-dim(A)``, uniform random actions for the first steps, one update of every network
per environment step. :func:`train_sac` runs it once for a :class:`SACConfig` and a seed.

References:
    Haarnoja, Zhou, Abbeel & Levine, "Soft Actor-Critic: Off-Policy Maximum Entropy Deep
    Reinforcement Learning with a Stochastic Actor", ICML 2018; and "Soft Actor-Critic
    Algorithms and Applications", arXiv:1812.05905 (temperature tuning).
"""

from __future__ import annotations

import copy
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

from flowkit.train import refresh_interval, resolve_device
from flowkit.validation import ArgumentError

from .common import mlp
from .sac_policies import POLICIES, FlowPolicy, GaussianPolicy, save_policy, squash

__all__ = ["SACConfig", "train_sac"]


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
    ``policy_path``, the trained policy is saved there
    (:func:`~flowkit.app.sac_policies.save_policy`).

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
        raise ArgumentError("env_id", f"{config.env_id!r} is not a gymnasium environment: {e}"
                            ) from e
    if not isinstance(env.action_space, gym.spaces.Box):
        raise ArgumentError(
            "env_id", f"{config.env_id!r} has a {type(env.action_space).__name__} action space: "
            "SAC here needs a continuous (Box) action space"
        )
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
    bar = tqdm(range(1, config.steps + 1), disable=not progress, unit="step",
               desc=f"{config.policy} seed {seed}", dynamic_ncols=True,
               mininterval=refresh_interval())
    for step in bar:
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
            bar.set_postfix(eval_return=f"{eval_returns[-1]:.1f}", refresh=False)
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
