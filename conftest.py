"""Collection rules for the doctests of ``pytest --doctest-modules flowkit``: modules of optional
integrations are skipped when their library is not installed (their tests in tests/ skip too)."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("sbi") else ["flowkit/integrations/sbi.py"]
