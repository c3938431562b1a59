"""Optional integrations with other libraries.

Each submodule imports its library when it is itself imported, and :mod:`flowkit` never
imports them: ``import flowkit.integrations.sbi`` needs ``sbi`` (``pip install
"flowkit-made[sbi]"``), ``import flowkit`` does not.
"""
