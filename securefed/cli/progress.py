"""Progress on stderr shared by ``securefed train`` and ``securefed flower local``: the data
summary, one line or a rich bar per round (kept apart from :mod:`securefed.cli.root` so that
the Flower commands import it without the app, and the app without them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from securefed.cli.common import err

if TYPE_CHECKING:
    from securefed.training import RoundRecord, RunStart

__all__ = ["RoundDisplay", "data_summary"]


class RoundDisplay:
    """The data summary and per-round progress on stderr: a rich bar on a terminal, plain
    lines otherwise (a bar redrawn in place shows nothing in a log file until the end)."""

    def __init__(self, *, plain: bool) -> None:
        self.plain = plain
        self.rounds: int | None = None
        self.downloads: dict[str, Any] = {}
        self.bar: Progress | None = None
        self.task: Any = None

    def __enter__(self) -> RoundDisplay:
        if not self.plain:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"),
                console=err,
                transient=False,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task("rounds", total=None, status="loading data")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)

    def _line(self, text: str) -> None:
        err.print(text, highlight=False, soft_wrap=True, markup=False)

    def download(self, description: str, done: int, total: int | None) -> None:
        if self.bar is None:
            if description not in self.downloads:
                self.downloads[description] = True
                size = f" ({total / 1e6:.1f} MB)" if total else ""
                self._line(f"downloading {description}{size}")
            return
        if description not in self.downloads:
            self.downloads[description] = self.bar.add_task(description, total=total, status="")
        self.bar.update(self.downloads[description], completed=done, total=total)

    def start(self, start: RunStart) -> None:
        self.rounds = start.rounds
        for line in data_summary(start.data):
            self._line(line)
        for note in start.notes:
            self._line(note)
        if start.resumed:
            self._line(
                f"resuming {start.run_dir} after round {start.start_round} of {start.rounds}"
            )
        if self.bar is not None:
            self.bar.update(self.task, total=start.rounds, completed=start.start_round, status="")

    def round(self, rec: RoundRecord) -> None:
        v = rec.values
        loss = v["loss"]
        status = f"loss {loss:.4f}" if abs(loss) < 1e4 else f"loss {loss:.4g}"
        if "val_hr@10" in v:
            status += f"  val HR@10 {v['val_hr@10']:.4f}"
        if v.get("epsilon") is not None:
            status += f"  eps {v['epsilon']:.3f}"
        total = rec.rounds_planned or self.rounds
        if self.bar is not None:
            self.bar.update(self.task, completed=rec.round, total=total, status=status)
        else:
            seconds = v.get("train_seconds", 0.0) + v.get("eval_seconds", 0.0)
            self._line(f"round {rec.round}/{total or '?'}  {status}  ({seconds:.1f} s)")
        if rec.warning:
            err.print(
                f"[bold yellow]warning:[/] {escape(rec.warning)}", highlight=False, soft_wrap=True
            )
        if v.get("aborted"):
            err.print(
                f"[bold yellow]round {rec.round} aborted, the shared model took no step:[/] "
                f"{escape(str(v['aborted']))}",
                highlight=False,
                soft_wrap=True,
            )


def data_summary(data: dict[str, Any]) -> list[str]:
    """One or two lines on what the run trains on, from its ``data.json`` record."""
    lines = [
        f"data: {data['name']}: {data['users']:,} users, {data['items']:,} items, "
        f"{data.get('interactions', data['train_interactions']):,} interactions kept"
    ]
    least = data.get("min_interactions")
    dropped = f"{data['dropped_users']:,} users dropped"
    if least is not None:
        dropped += f" (fewer than {least} interactions"
        if data["dropped_users"]:
            dropped += f": {data['dropped_interactions']:,} interactions"
        dropped += ")"
    lines.append(f"      {dropped}, {data['duplicate_rows']:,} duplicate rows removed")
    # What loading noticed beyond those counts (ids read as strings, users without
    # demographics); the counts' own notes are the line above.
    from securefed.data.loaders import COUNT_NOTE

    lines.extend(f"      {n}" for n in data.get("notes", []) if not COUNT_NOTE.match(str(n)))
    return lines
