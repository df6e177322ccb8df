"""The ``securefed`` command, one module per surface (as Flower's ``flwr/cli/``).

- :mod:`securefed.cli.root`: the app, ``train`` and ``account``, and the entry point;
- :mod:`securefed.cli.audit`, :mod:`securefed.cli.report`, :mod:`securefed.cli.flower`: the
  commands registered beside them;
- :mod:`securefed.cli.common`: options, the one-line error rule and rendering the commands
  share; :mod:`securefed.cli.costs`: the estimates and measured costs a command prints.

Each is a thin layer over the public Python API (``securefed``, ``securefed.report``,
``attacks``, ``securefed.flower``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    """``app`` and ``main`` on first use (PEP 562), so that a command module (audit, report,
    Flower) imports without the app that registers it."""
    if name in __all__:
        from securefed.cli import root

        return getattr(root, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
