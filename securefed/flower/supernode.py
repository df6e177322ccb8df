"""``flower-supernode`` with a configurable idle poll of the SuperLink.

Flower 1.42's SuperNode asks the SuperLink for a message, and when there is none sleeps a
fixed 3 s (``time.sleep(3)`` in ``flwr.supernode.start_client_internal``; no option, no
environment variable) and waits for its ClientApp's reply in 0.5 s sleeps. A round is five
exchanges, and each one waits for the slowest node's poll: 3 s of idle poll cost up to 15 s a
round whatever the model. This entry point runs Flower's own ``flower-supernode`` with both
sleeps capped at ``--idle-poll`` seconds (the module's ``time`` is replaced by one whose
``sleep`` is capped; nothing else changes). If Flower's loop no longer has that sleep, the cap
is not applied and a warning says so: the SuperNode then runs exactly as Flower ships it.

    python -m securefed.flower.supernode --idle-poll 0.2 [flower-supernode arguments]
"""

from __future__ import annotations

import inspect
import sys
import time
import types
import warnings

#: Default idle poll in seconds (Flower: 3). One small authenticated HTTPS request per idle
#: SuperNode this often: 5 a second, against up to 3 s of latency per exchange.
DEFAULT_IDLE_POLL = 0.2


def _capped_time(cap: float) -> types.ModuleType:
    clock = types.ModuleType("time")
    clock.__dict__.update(time.__dict__)

    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, cap))

    clock.sleep = sleep  # type: ignore[attr-defined]
    return clock


def cap_idle_poll(cap: float) -> bool:
    """Cap the SuperNode loop's sleeps at ``cap`` seconds; False if Flower's loop changed."""
    if not 0 < cap <= 3:
        raise ValueError(f"idle poll must be in (0, 3] seconds, got {cap!r}")
    from flwr.supernode import start_client_internal as loop

    if "time.sleep(3)" not in inspect.getsource(loop.start_client_internal):
        warnings.warn(
            "this Flower version's SuperNode loop has no fixed 3 s idle sleep; "
            "its own polling is used",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    loop.time = _capped_time(cap)
    return True


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    cap = DEFAULT_IDLE_POLL
    if "--idle-poll" in args:
        i = args.index("--idle-poll")
        cap = float(args[i + 1])
        del args[i : i + 2]
    cap_idle_poll(cap)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *args]
    flower_supernode()


if __name__ == "__main__":
    main()
