"""securefed on Flower: the same protocol across real processes and machines.

Flower (PyPI ``flwr``, the ``flower`` extra) provides only the transport, the scheduling and
the app model; every privacy step is securefed's own:

* :mod:`securefed.flower.pipeline` – the privacy pipeline split into a node half (clip, DP
  rounding and noise share, ring encoding) and a server half (decode, ledger);
* :mod:`securefed.flower.node` – a node holding one partition of users: local training,
  persistent private state, one SecAgg client stage machine per user;
* :mod:`securefed.flower.server` – the round driver: cohort, SecAgg server stages, model
  step, ledger, federated evaluation, the run directory;
* :mod:`securefed.flower.session` – one round's SecAgg secrets on a node between messages;
* :mod:`securefed.flower.models` – each model's private (per-user) and shared state;
* :mod:`securefed.flower.messages` – the stage messages, independent of the transport;
* :mod:`securefed.flower.local` – an in-process transport (tests, protocol benchmarks);
* :mod:`securefed.flower.apps` – Flower's ``ServerApp`` / ``ClientApp`` (imports ``flwr``);
* :mod:`securefed.flower.deploy` – a local deployment (SuperLink + SuperNodes on loopback)
  and Flower's simulation engine;
* :mod:`securefed.flower.worker` – one long-lived ClientApp process per SuperNode (Flower's
  ``process`` isolation mode);
* :mod:`securefed.flower.supernode` – ``flower-supernode`` with a configurable idle poll.

See ``docs/deployment.md``.
"""

from __future__ import annotations

from securefed.errors import ConfigError


def require_flwr() -> None:
    """Raise a clear :class:`ConfigError` when the ``flower`` extra is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise ConfigError(
            "Flower is not installed; install the extra: pip install 'securefed[flower]'"
        ) from None


__all__ = ["require_flwr"]
