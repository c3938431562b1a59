"""Variational inference with an inverse autoregressive flow (IAF) on a 2-D energy function
========================================================================================


    .venv/bin/python demos/energy_vi.py                  # U3, about a minute on a laptop CPU
    .venv/bin/python demos/energy_vi.py --energy U4 --device cuda

Here there are no data: only an unnormalised density p~(z) = exp(-U(z)), one of the four
energies of Rezende & Mohamed (2015). The flow q is fitted by reverse KL, i.e. by maximising the
evidence lower bound

    ELBO = E_q[log p~(z) - log q(z)] = log Z - KL(q || p)  <=  log Z,

with samples from q itself. An IAF is the flow for this job: it draws a sample and its exact
log-density in one pass per layer. Since log Z is known here (computed on a fine grid), the gap
log Z - ELBO is the KL from q to the target: 0 for a perfect fit.

U2-U4 do not decay along z1, so the target is taken on the box z1 in [-4, 4], with a soft wall
outside it (flowkit.data.walled_log_density). All four energies: ``flowkit energy --out DIR``.
"""

import argparse

import torch

from flowkit import IAF
from flowkit.data import (
    ENERGIES,
    ENERGY_BOXES,
    energy_log_density,
    walled_log_density,
    walled_log_normalizer,
)
from flowkit.plot import Panel, grid_log_density, panel_figure, save_figure
from flowkit.train import fit_reverse_kl, resolve_device

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--energy", default="U3", choices=ENERGIES)
parser.add_argument("--steps", type=int, default=2000)
parser.add_argument("--device", default="auto", help="auto = cuda if available, else cpu")
parser.add_argument("--out", default="runs/demo-energy", help="folder for the figure")
args = parser.parse_args()
device = resolve_device(args.device)
box = ENERGY_BOXES[args.energy]
torch.manual_seed(0)  # the initial weights


def target(z):
    """log p~(z): minus the energy, with the soft wall outside the box."""
    return walled_log_density(args.energy, z)


# 1. The model: 5 IAF layers with spline transformers on [-6, 6] (U4 reaches z2 = -6).
flow = IAF(
    2,
    layers=5,
    hidden_features=(64, 64),
    transformer="spline",
    transformer_kwargs={"bins": 16, "bound": 6.0},
)

# 2. Training: each step draws 256 samples from the flow and follows the gradient of -ELBO.
history = fit_reverse_kl(
    flow,
    target,
    steps=args.steps,
    batch_size=256,
    lr=3e-3,
    lr_schedule="cosine",
    seed=0,
    device=device,
)
print(f"trained {args.steps} steps in {history.wall_time:.1f} s on {device}")

# 3. The ELBO on 20,000 fresh samples, against the true log Z.
with torch.no_grad():
    z, log_q = flow.sample_and_log_prob(20_000)
    elbo = (target(z) - log_q).mean().item()
log_z = walled_log_normalizer(args.energy)
print(f"{args.energy}: ELBO {elbo:.3f}, log Z {log_z:.3f}, KL(q || p) = {log_z - elbo:.3f} nats")

# 4. Figure: target | flow density (the IAF's solving direction: D = 2 sequential steps per
#    layer, about one pass of arithmetic) | flow samples.
panels = [
    Panel(
        f"target exp(-{args.energy})\nlog Z {log_z:.3f}",
        box,
        log_density=grid_log_density(lambda x: energy_log_density(args.energy, x), box),
    ),
    Panel(
        f"IAF density\nELBO {elbo:.3f}   KL {log_z - elbo:.3f}",
        box,
        log_density=grid_log_density(flow.log_prob, box, device=device),
    ),
    Panel("IAF samples", box, samples=z[:4000]),
]
path = save_figure(panel_figure([panels], row_labels=[args.energy]), f"{args.out}/energy.png")
print(f"figure: {path}")
