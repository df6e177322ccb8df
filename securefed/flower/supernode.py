"""``flower-supernode`` with a configurable idle poll of the SuperLink.

Flower 1.42's SuperNode asks the SuperLink for a message, and when there is none sleeps a
fixed 3 s (``time.sleep(3)`` in ``flwr.supernode.start_client_internal``; no option, no
environment variable) and waits for its ClientApp's reply in 0.5 s sleeps. A round is five
exchanges, and each one waits for the slowest node's poll: 3 s of idle poll cost up to 15 s a
round whatever the model. This entry point runs Flower's own ``flower-supernode`` with both
sleeps capped at ``--idle-poll`` seconds (the module's ``time`` is replaced by one whose
``sleep`` is capped; nothing else changes). If Flower's loop no longer has that sleep, the cap
is not applied and a warning says so: the SuperNode then runs exactly as Flower ships it.

The same holds for the SuperNode's pull of a message's objects from the SuperLink: it may
start before the sender has finished uploading them, and Flower then backs off 1 s first (10 s
cap) per object. With ClientApp processes that take seconds to start nobody notices; with a
long-lived one every such stage waits a second. :func:`shorten_object_backoff` starts that
backoff at 20 ms (cap 0.5 s); the number of tries and the overall time limit stay Flower's.

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


#: First and largest backoff (s) while an object is not yet available: Flower's are 1 and 10.
OBJECT_BACKOFF = (0.02, 0.5)


def shorten_object_backoff(module: types.ModuleType) -> bool:
    """Make ``module``'s ``pull_objects`` (Flower's, imported by name) back off from 20 ms;
    False (and nothing changed) if it has no such function."""
    import functools

    from flwr.supercore.inflatable import inflatable_utils

    if getattr(module, "pull_objects", None) is not inflatable_utils.pull_objects:
        return False
    module.pull_objects = functools.partial(  # type: ignore[attr-defined]
        inflatable_utils.pull_objects,
        initial_backoff=OBJECT_BACKOFF[0],
        backoff_cap=OBJECT_BACKOFF[1],
    )
    return True


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    cap = DEFAULT_IDLE_POLL
    if "--idle-poll" in args:
        i = args.index("--idle-poll")
        cap = float(args[i + 1])
        del args[i : i + 2]
    cap_idle_poll(cap)
    from flwr.supernode import start_client_internal

    shorten_object_backoff(start_client_internal)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *args]
    flower_supernode()


if __name__ == "__main__":
    main()
