"""The ``Flow`` model and the ``MAF``/``IAF`` builders."""

from flowkit.flows.builders import IAF, MAF, activation_class
from flowkit.flows.flow import Flow

__all__ = ["IAF", "MAF", "Flow", "activation_class"]
