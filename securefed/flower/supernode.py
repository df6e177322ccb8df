"""``flower-supernode`` with a configurable idle poll of the SuperLink.

Flower 1.42's SuperNode asks the SuperLink for a message, and when there is none sleeps a
fixed 3 s (``time.sleep(3)`` in ``flwr.supernode.start_client_internal``; no option, no
environment variable) and waits for its ClientApp's reply in 0.5 s sleeps. A round is five
exchanges, and each one waits for the slowest node's poll: 3 s of idle poll cost up to 15 s a
round whatever the model. This entry point runs Flower's own ``flower-supernode`` with the
module's ``time`` replaced by one whose ``sleep`` (nothing else changes):

* for the idle poll, backs off from 20 ms after the node's last message, doubling up to
  ``--idle-poll`` seconds: the next stage of a round usually comes within a second, so it is
  noticed within tens of milliseconds, while an idle node polls every ``--idle-poll`` s;
* for the local waits (its ClientApp's reply, in the SuperNode's own memory), sleeps 20 ms.

If Flower's loop no longer has the fixed sleep, nothing is replaced and a warning says so:
the SuperNode then runs exactly as Flower ships it.

The same holds for the SuperNode's pull of a message's objects from the SuperLink: it may
start before the sender has finished uploading them, and Flower then backs off 1 s first (10 s
cap) per object. With ClientApp processes that take seconds to start nobody notices; with a
long-lived one every such stage waits a second. :func:`shorten_object_backoff` starts that
backoff at 20 ms (cap 0.1 s); tries are then bounded by Flower's overall time limit for a
pull (``PULL_MAX_TIME``, 2 h) instead of its count of tries, which at these short waits would
give up on a large upload within a minute.

    python -m securefed.flower.supernode --idle-poll 0.2 [flower-supernode arguments]
"""

from __future__ import annotations

import inspect
import math
import sys
import time
import types
import warnings

#: Default idle poll in seconds (Flower: 3). One small authenticated HTTPS request per idle
#: SuperNode this often: 5 a second, against up to 3 s of latency per exchange.
DEFAULT_IDLE_POLL = 0.2
#: First idle poll after a message, and every local wait (seconds).
SHORT_WAIT = 0.02
_FLOWER_IDLE_SLEEP = 3
#: Longest idle poll accepted (seconds): Flower's own fixed sleep.
MAX_IDLE_POLL = _FLOWER_IDLE_SLEEP


class _Clock:
    """``time`` for Flower's SuperNode loop: adaptive idle poll, short local waits."""

    def __init__(self, cap: float) -> None:
        self.cap = cap
        self.next = SHORT_WAIT

    def sleep(self, seconds: float) -> None:
        if seconds >= _FLOWER_IDLE_SLEEP:  # nothing to do: poll the SuperLink again soon
            wait, self.next = self.next, min(self.next * 2, self.cap)
        else:  # waiting for its ClientApp: the node is busy, keep the idle poll short next
            wait, self.next = min(seconds, SHORT_WAIT), SHORT_WAIT
        time.sleep(wait)


def _clock_module(cap: float) -> types.ModuleType:
    clock = types.ModuleType("time")
    clock.__dict__.update(time.__dict__)
    clock.sleep = _Clock(cap).sleep  # type: ignore[attr-defined]
    return clock


def cap_idle_poll(cap: float) -> bool:
    """Poll adaptively up to ``cap`` seconds when idle (see the module docstring); False
    (and nothing changed) if Flower's loop changed."""
    if not 0 < cap <= MAX_IDLE_POLL:
        raise ValueError(f"idle poll must be in (0, {MAX_IDLE_POLL}] seconds, got {cap!r}")
    from flwr.supernode import start_client_internal as loop

    if f"time.sleep({_FLOWER_IDLE_SLEEP})" not in inspect.getsource(loop.start_client_internal):
        warnings.warn(
            "this Flower version's SuperNode loop has no fixed 3 s idle sleep; "
            "its own polling is used",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    loop.time = _clock_module(cap)
    return True


#: First and largest backoff (s) while an object is not yet available: Flower's are 1 and 10.
OBJECT_BACKOFF = (0.02, 0.1)


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
        max_tries_per_object=None,  # Flower's time limit (PULL_MAX_TIME) bounds the wait
    )
    return True


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    cap = DEFAULT_IDLE_POLL
    if "--idle-poll" in args:
        i = args.index("--idle-poll")
        value = args[i + 1] if i + 1 < len(args) else ""
        try:
            cap = float(value)
        except ValueError:
            cap = math.nan
        if not 0 < cap <= MAX_IDLE_POLL:  # a user's mistake: one line, exit 2
            print(
                f"error: --idle-poll takes seconds in (0, {MAX_IDLE_POLL:g}], as a number "
                f"(e.g. 0.2), got {value!r}",
                file=sys.stderr,
            )
            raise SystemExit(2)
        del args[i : i + 2]
    cap_idle_poll(cap)
    from flwr.supernode import start_client_internal

    shorten_object_backoff(start_client_internal)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *args]
    flower_supernode()


if __name__ == "__main__":
    main()
