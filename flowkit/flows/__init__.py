"""The ``Flow`` model and the ``MAF``/``IAF`` builders."""

from flowkit.flows.builders import IAF, MAF
from flowkit.flows.flow import Flow

__all__ = ["IAF", "MAF", "Flow"]
