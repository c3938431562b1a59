"""Experiments behind the ``flowkit`` CLI subcommands."""
