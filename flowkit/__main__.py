"""``python -m flowkit``: the same as the ``flowkit`` command."""

from flowkit.cli import main

raise SystemExit(main())
