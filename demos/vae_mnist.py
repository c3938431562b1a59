"""VAE on binarized MNIST: diagonal-Gaussian vs IAF posterior (see docs/vae.md)
============================================================================


Same as ``flowkit vae ARGS``; for example::

    .venv/bin/python demos/vae_mnist.py --quick --root ../shared/data --out runs/vae-quick
    .venv/bin/python demos/vae_mnist.py --root ../shared/data --epochs 30 --eval-images 2000 \\
        --out runs/vae

The data are read from ``--root`` (else ``$FLOWKIT_DATA``, else ``~/.cache/flowkit``).
"""

import sys

from flowkit.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["vae", *sys.argv[1:]]))
