"""SAC on Pendulum-v1: conditional IAF policy vs Gaussian policy (see docs/rl.md)
==============================================================================


Same as ``flowkit rl ARGS`` (needs the optional extra: ``pip install gymnasium``); for
example::

    .venv/bin/python demos/sac_pendulum.py --quick --out runs/rl-quick
    .venv/bin/python demos/sac_pendulum.py --seeds 3 --steps 10000 --out runs/rl
"""

import sys

from flowkit.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["rl", *sys.argv[1:]]))
