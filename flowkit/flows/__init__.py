"""The ``Flow`` model, the ``MAF``/``IAF`` builders, and a flow as a torch distribution."""

from flowkit.flows.builders import IAF, MAF
from flowkit.flows.diagnostics import (
    ImportanceEstimate,
    importance_sampling,
    spline_edge_shares,
    spline_layers,
)
from flowkit.flows.distribution import KL_SAMPLES, FlowDistribution, monte_carlo_kl
from flowkit.flows.flow import Flow

__all__ = [
    "IAF",
    "KL_SAMPLES",
    "MAF",
    "Flow",
    "FlowDistribution",
    "ImportanceEstimate",
    "importance_sampling",
    "monte_carlo_kl",
    "spline_edge_shares",
    "spline_layers",
]
