"""What the benchmarks measure: flows and models with non-trivial weights, their dense-MLP
floors, the calls of each section, and the peer libraries' flows of the same shape."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

import flowkit
from flowkit.transforms import Compose, MaskedAffineAutoregressive, MaskedAutoregressive
from flowkit.validation import validate_values


def make_flow(kind: str, spec: dict, device: torch.device) -> tuple[flowkit.Flow, Tensor]:
    """A MAF or IAF with non-trivial weights (not the identity it starts as) and data. With
    ``spec["direct"]``, a one-layer affine MAF whose MADE has a direct connection (the
    builders have no such option)."""
    if spec.get("direct"):
        made = flowkit.MADE(spec["features"], spec["hidden"], params_per_feature=2,
                            direct_connection=True, seed=spec["seed"])
        layer = MaskedAffineAutoregressive(made, "maf")
        flow = flowkit.Flow(Compose([layer]), flowkit.StandardNormal(spec["features"]))
    else:
        builder = flowkit.MAF if kind == "maf" else flowkit.IAF
        # no LU-linear maps (MAF's default): the peers' flows have none, and the rows measure
        # the MADEs and the solver, as they did before that default
        flow = builder(spec["features"], layers=spec["layers"],
                       hidden_features=spec["hidden"], seed=spec["seed"], lu_linear=False)
    flow = flow.to(device)
    generator = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for module in flow.modules():
            if isinstance(module, MaskedAutoregressive):
                w = module.made.output.weight
                w.copy_(torch.randn(w.shape, generator=generator) * 0.01)
    x = torch.randn(spec["batch"], spec["features"], generator=generator).to(device)
    return flow, x


class DenseMLP(nn.Module):
    """A MADE's network without its masks: same shapes and weights, dense arithmetic."""

    def __init__(self, made: flowkit.MADE):
        super().__init__()
        self.shape = (made.features, made.params_per_feature)
        self.activation = made.activation
        self.hidden = nn.ModuleList(_linear(layer) for layer in made.hidden)
        self.output = _linear(made.output)
        self.direct = None if made.direct is None else _linear(made.direct)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return self._forward(x, context)

    def _forward(self, x: Tensor, context: Tensor | None) -> Tensor:
        """What a flow layer calls (as it calls :meth:`flowkit.MADE._forward`)."""
        x = x if context is None else torch.cat([x, context], dim=-1)
        h = x
        for layer in self.hidden:
            h = self.activation(layer(h))
        out = self.output(h)
        if self.direct is not None:
            out = out + self.direct(x)
        return out.unflatten(-1, self.shape)


def _linear(masked: nn.Linear) -> nn.Linear:
    bias = masked.bias is not None
    layer = nn.Linear(masked.in_features, masked.out_features, bias=bias,
                      device=masked.weight.device)
    layer.load_state_dict({"weight": masked.weight, **({"bias": masked.bias} if bias else {})})
    return layer


def adam(model: nn.Module, lr: float) -> torch.optim.Adam:
    """Adam over ``model``'s parameters as :func:`flowkit.fit` builds it (torch's fused kernels),
    so that a timed training step is the step a user's ``fit`` takes."""
    return torch.optim.Adam(model.parameters(), lr=lr, fused=True)


def adam_step(model: nn.Module, x: Tensor, lr: float) -> Callable[[], None]:
    """A call that takes one :func:`adam` step on ``-model.log_prob(x).mean()`` (the NaN/Inf
    check of the inputs off, as in the timed log-density calls)."""
    optimizer = adam(model, lr)

    def step() -> None:
        with validate_values(False):
            loss = -model.log_prob(x).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


def dense_products(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose MADEs always compute the dense masked products ``W * M``
    (:attr:`flowkit.nn.MADE.product`), flowkit's path before the block staircase."""
    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, flowkit.MADE):
            module.product = "dense"
    return model


def densify(flow: flowkit.Flow) -> flowkit.Flow:
    """A copy of ``flow`` whose conditioners are dense MLPs (not a valid flow: a timing floor)."""
    dense = copy.deepcopy(flow)
    for module in dense.modules():
        if isinstance(module, MaskedAutoregressive):
            module.made = DenseMLP(module.made)
    return dense


@contextmanager
def naive_solver(model: nn.Module) -> Iterator[None]:
    """Within the block, every MADE of ``model`` is solved by the naive D-pass reference
    (:attr:`flowkit.nn.MADE.solver`): the same calls, same noise and same code path but for
    the solver."""
    mades = [m for m in model.modules() if isinstance(m, flowkit.MADE)]
    for made in mades:
        made.solver = "naive"
    try:
        yield
    finally:
        for made in mades:
            made.solver = "fast"


def sampling_calls(kind: str, flow: flowkit.Flow, x: Tensor) -> dict[str, Callable[[], Tensor]]:
    """(one pass in the cheap direction, the solving call, the solving call with the naive
    solver) for a MAF (sampling) or an IAF (density of points it did not sample)."""
    n = x.shape[0]

    def no_checks(fn: Callable[[], Tensor]) -> Callable[[], Tensor]:
        def call() -> Tensor:
            with torch.no_grad(), validate_values(False):
                return fn()
        return call

    def naive(fn: Callable[[], Tensor]) -> Callable[[], Tensor]:
        def call() -> Tensor:
            with naive_solver(flow):
                return fn()
        return call

    if kind == "maf":
        one, solved = no_checks(lambda: flow.log_prob(x)), no_checks(lambda: flow.sample(n))
        return {"MAF log_prob": one, "MAF sample": solved, "MAF sample, naive": naive(solved)}
    one = no_checks(lambda: flow.sample_and_log_prob(n)[1])
    solved = no_checks(lambda: flow.log_prob(x))
    return {"IAF sample_and_log_prob": one, "IAF log_prob": solved,
            "IAF log_prob, naive": naive(solved)}


def make_bernoulli(spec: dict, device: torch.device) -> flowkit.BernoulliMADE:
    model = flowkit.BernoulliMADE(spec["features"], spec["hidden"], seed=spec["seed"]).to(device)
    generator = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        w = model.made.output.weight
        w.copy_(torch.randn(w.shape, generator=generator) / w.shape[1] ** 0.5)
    return model


def bernoulli_calls(model: flowkit.BernoulliMADE, samples: int,
                    seed: int) -> dict[str, Callable[[], Tensor]]:
    device = model.made.output.weight.device

    def sample() -> Tensor:
        return model.sample(samples, generator=torch.Generator(device).manual_seed(seed))

    def cold() -> Tensor:
        with torch.no_grad():  # an in-place update, as an optimizer step would make
            model.made.output.weight.add_(0.0)
        return sample()

    def naive() -> Tensor:
        with naive_solver(model):
            return sample()

    return {"sample": sample, "sample, cold": cold, "sample, naive": naive}


def peer_flows(spec: dict, device: torch.device) -> dict[str, tuple[Callable, Callable]]:
    """``{library: (log_prob(x) -> call, sample(n) -> call)}`` for the installed ones, MAFs of
    the same shape (affine layers, reversed orderings, ReLU MADEs without residual blocks)."""
    out: dict[str, tuple[Callable, Callable]] = {}
    features, hidden, layers = spec["features"], spec["hidden"], spec["layers"]
    try:
        import zuko
    except ImportError:
        pass
    else:
        flow = zuko.flows.MAF(features, transforms=layers, hidden_features=hidden).to(device)
        out["zuko"] = (
            lambda x: _no_grad(lambda: flow().log_prob(x)),
            lambda n: _no_grad(lambda: flow().sample((n,))),
        )
    try:
        from nflows import distributions, flows, transforms
    except ImportError:
        pass
    else:
        steps = []
        for _ in range(layers):
            steps += [
                transforms.MaskedAffineAutoregressiveTransform(
                    features, hidden[0], num_blocks=len(hidden) - 1,
                    use_residual_blocks=False),
                transforms.ReversePermutation(features),
            ]
        nf = flows.Flow(transforms.CompositeTransform(steps[:-1]),
                        distributions.StandardNormal([features])).to(device)
        out["nflows"] = (
            lambda x: _no_grad(lambda: nf.log_prob(x)),
            lambda n: _no_grad(lambda: nf.sample(n)),
        )
    return out


def _no_grad(fn: Callable[[], Tensor]) -> Callable[[], Tensor]:
    def call() -> Tensor:
        with torch.no_grad():
            return fn()
    return call
