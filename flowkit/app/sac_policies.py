r"""The two SAC policies of flowkit rl, and the squashing of their actions into the action box.

Both draw a pre-squash action ``u`` given the observation ``s`` with its exact log-density;
:func:`squash` maps it into the box and corrects the density:

* :class:`GaussianPolicy`: ``u = mu(s) + sigma(s) * eps``, an MLP giving ``mu`` and
  ``log sigma``;
* :class:`FlowPolicy`: ``u, log pi(u | s) = flow.sample_and_log_prob(context=s)``, with
  ``flow`` a conditional :func:`flowkit.IAF` reading ``s`` as context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flowkit.checkpoint import save_checkpoint, save_model
from flowkit.flows import IAF

from .common import mlp

__all__ = ["POLICIES", "FlowPolicy", "GaussianPolicy", "save_policy", "squash"]

POLICIES = ("gaussian", "iaf")
"""The ``policy`` names of :class:`~flowkit.app.sac.SACConfig`."""

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
        """The action of zero noise (the image of the base's mode,
        :meth:`flowkit.Flow.sample_from_noise`): ``(B, A)``."""
        return self.flow.sample_from_noise(obs.new_zeros(self.flow.features), obs)


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
