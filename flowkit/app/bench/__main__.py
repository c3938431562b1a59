"""``python -m flowkit.app.bench [options]``: the same as ``flowkit bench [options]``."""

import sys

from flowkit.app.cli import main

raise SystemExit(main(["bench", *sys.argv[1:]]))
