"""The guard of a local deployment: a small process, in a session of its own, that stops the
deployment's processes when the command that started them dies without stopping them.

``securefed flower local`` stops its SuperLink, SuperNodes and workers on Ctrl-C, SIGTERM and
every error (:meth:`securefed.flower.deploy.LocalDeployment.stop`); a ``kill -9`` of the
command leaves them running, in sessions of their own, and they finished the run in the
background, without yardsticks, and then stayed up (found in a deployment walkthrough). The
guard watches the command's pid (and start time, so a reused pid does not count); when it is
gone it stops every process the deployment recorded in :data:`GUARD_FILE`, and what they
started, as ``stop`` does. It exits when the command removes the file (a normal stop).
Standard library only: it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: The deployment's process record in its work directory, one per command (``{pid}``: its
#: pid), so that a guard still stopping a killed command's deployment never removes the record
#: of a deployment resumed meanwhile in the same directory (found in review): one
#: ``<pid> <start time>`` a line.
GUARD_FILE = "deployment-{pid}.pids"
#: How often the guard looks at the command (s).
GUARD_PERIOD = 0.5


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None if unreadable)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> str | None:
    fields = _proc_stat(pid)
    return fields[19] if fields is not None and fields[0] != "Z" else None


def _descendants(roots: list[int]) -> dict[int, str]:
    """Every live descendant of ``roots`` (by parent pid, from ``/proc``) with its start time;
    empty where ``/proc`` is missing."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _proc_stat(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: dict[int, str] = {}
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            start = _start_time(child)
            if start is not None and child not in out:
                out[child] = start
                todo.append(child)
    return out


def _group_members(pgid: int) -> list[int]:
    """Live processes of the process group ``pgid`` (from ``/proc``; empty elsewhere)."""
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _proc_stat(int(entry.name))
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def record_process(path: Path, pid: int) -> None:
    """Add ``pid`` (a process group leader the deployment started) to the guard's record."""
    start = _start_time(pid)
    if start is not None:
        with path.open("a") as fh:
            fh.write(f"{pid} {start}\n")


def start_guard(work_dir: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path] | None:
    """Start the guard of a deployment whose processes :func:`record_process` records in the
    returned file (``work_dir`` / :data:`GUARD_FILE`); None where ``/proc`` is missing (it
    could not tell a live command from a reused pid)."""
    me = _start_time(os.getpid())
    if me is None:
        return None
    path = work_dir / GUARD_FILE.format(pid=os.getpid())
    path.write_text("")
    with (work_dir / "logs" / "guard.log").open("ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "securefed.flower.guard",
                "--parent",
                str(os.getpid()),
                "--parent-start",
                me,
                "--record",
                str(path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return proc, path


def _recorded(path: Path) -> dict[int, str]:
    out: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            pid, _, start = line.partition(" ")
            if pid.isdigit() and start:
                out[int(pid)] = start
    return out


def stop_recorded(leaders: dict[int, str], grace: float = 5.0) -> None:
    """Stop the process groups of ``leaders`` (pid -> start time) and everything they
    started: SIGTERM, up to ``grace`` seconds for the leaders to exit, then SIGKILL whatever
    is left in the groups, or of what they started (a process in a session of its own, such
    as the SuperLink's flwr-serverapp, once found retrying a dead SuperLink for hours).

    A group is ours while its leader is the recorded process, or while the leader is gone (or
    a zombie) and the group still has members: a group's number is not given to a new process
    while the group exists. :meth:`securefed.flower.deploy.LocalDeployment.stop` and the
    guard both stop a deployment with it."""

    def ours(pid: int, start: str) -> bool:
        now = _start_time(pid)
        return now == start or (now is None and bool(_group_members(pid)))

    live = [pid for pid, start in leaders.items() if ours(pid, start)]
    started = _descendants(live)
    for pid in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_start_time(pid) == leaders[pid] for pid in live):
        time.sleep(0.05)
    # Whatever is left in a group, or of what they started, outlived its leader or ignored
    # SIGTERM: no stragglers.
    for pid in live:
        if _group_members(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    for pid, start in started.items():
        if _start_time(pid) == start:  # the same process, not a reused pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--parent", type=int, required=True, help="The command's pid.")
    ap.add_argument("--parent-start", required=True, help="Its start time (/proc/<pid>/stat).")
    ap.add_argument("--record", type=Path, required=True, help="The deployment's process record.")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the command's to handle
    while args.record.exists():
        if _start_time(args.parent) != args.parent_start:
            leaders = _recorded(args.record)
            print(
                f"the command (pid {args.parent}) is gone without stopping its deployment: "
                f"stopping {len(leaders)} process group(s)",
                flush=True,
            )
            stop_recorded(leaders)
            args.record.unlink(missing_ok=True)
            return
        time.sleep(GUARD_PERIOD)


if __name__ == "__main__":
    main()
