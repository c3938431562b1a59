"""``python -m flowkit``: the same as the ``flowkit`` command."""

from flowkit.app.cli import main

raise SystemExit(main())
