"""``securefed report``: the privacy-utility sweep and its report (thin over securefed.report).

The lead registers it with ``app.command()(report)`` in :mod:`securefed.cli.root`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from securefed.cli.common import (
    Columns,
    DatasetName,
    EvalNegatives,
    SyntheticItems,
    SyntheticUsers,
    _fail,
    _interrupted,
    _user_errors,
    err,
    out,
    parse_columns,
)
from securefed.errors import ConfigError
from securefed.models.registry import model_names

#: The report's models when none are named: the federated ones (a reference is always added).
DEFAULT_MODELS = "fedals,fedrap,fedrecgel"


def _split_list(flag: str, value: str) -> list[str]:
    items = [v.strip() for v in value.split(",")]
    if not value.strip() or any(not v for v in items):
        raise ConfigError(f"{flag} takes a comma-separated list, got {value!r}")
    return items


def _epsilons(value: str) -> list[float]:
    out_: list[float] = []
    for v in _split_list("--epsilons", value):
        try:
            e = math.inf if v.lower() in ("inf", "infinity", "none") else float(v)
        except ValueError:
            raise ConfigError(
                f"--epsilons takes numbers or inf (no DP), got {v!r} in {value!r}"
            ) from None
        out_.append(e)
    return out_


def report(
    models: Annotated[
        str,
        typer.Option(help=f"Comma-separated models, any of: {', '.join(model_names())}."),
    ] = DEFAULT_MODELS,
    references: Annotated[
        str,
        typer.Option(
            help="CENTRALIZED references trained once per seed on the same split (ials, "
            "ease; EASE only up to 5000 items), or none."
        ),
    ] = "ials,ease",
    dataset: DatasetName = "synthetic",
    epsilons: Annotated[
        str, typer.Option(help="Comma-separated target epsilons; inf = no DP.")
    ] = "0.5,1,2,4,8,inf",
    defenses: Annotated[
        str, typer.Option(help="Comma-separated: none, dp, secagg, dp+secagg.")
    ] = "none,dp,secagg,dp+secagg",
    seeds: Annotated[int, typer.Option(help="Seeds per setting (0 .. N-1).")] = 3,
    rounds: Annotated[
        int | None,
        typer.Option(
            help="Rounds per cell of the federated models (default: each model's own; "
            "MostPop and the references keep theirs)."
        ),
    ] = None,
    jobs: Annotated[int, typer.Option(help="Cells trained in parallel processes.")] = 1,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Report directory (default report/).")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Folder holding datasets (else $SECUREFED_DATA_DIR).")
    ] = None,
    columns: Columns = None,
    eval_negatives: EvalNegatives = None,
    min_hr: Annotated[
        float | None,
        typer.Option(help="Utility floor (test HR@10) for the summary; default 90% of no-DP."),
    ] = None,
    delta: Annotated[float, typer.Option(help="DP delta of every private cell.")] = 1e-5,
    audit: Annotated[
        bool, typer.Option("--audit/--no-audit", help="Audit every cell with the attacks.")
    ] = True,
    synthetic_users: SyntheticUsers = None,
    synthetic_items: SyntheticItems = None,
    private_modes: Annotated[
        bool,
        typer.Option(
            "--private-modes/--no-private-modes",
            help="dp cells of a model with a private mode (FedRAP, FedRecGEL) run it: a "
            "private popularity prior in its scores, its rounds and Poisson cohorts "
            "(docs/privacy.md); off: DP on the model's uploads alone.",
        ),
    ] = True,
    from_dirs: Annotated[
        list[Path] | None,
        typer.Option(
            "--from",
            help="Build the report from existing run/audit/report directories (repeat, or "
            "list them after --from); no training.",
        ),
    ] = None,
    extra: Annotated[
        list[Path] | None, typer.Argument(help="More directories for --from.", show_default=False)
    ] = None,
) -> None:
    """Run a privacy-utility grid (models x defenses x epsilons x seeds) and write a report."""
    from securefed.report import ReportConfig, build_report, run_report

    with _user_errors():
        if extra and not from_dirs:
            raise _fail(f"unexpected argument {str(extra[0])!r}; directories go after --from")
        if from_dirs:
            given = [
                flag
                for flag, value in (("--columns", columns), ("--eval-negatives", eval_negatives))
                if value is not None
            ]
            if given:  # each run's config.toml says how its data was read
                raise _fail(
                    f"--from reads each run's data as its config.toml records; drop "
                    f"{', '.join(given)}"
                )
            target = out_dir or Path("report")
            result = build_report([*from_dirs, *(extra or [])], target, min_hr=min_hr)
        else:
            refs = (
                ()
                if references.strip().lower() == "none"
                else tuple(_split_list("--references", references))
            )
            config = ReportConfig(
                models=tuple(_split_list("--models", models)),
                references=refs,
                dataset=dataset,
                epsilons=tuple(_epsilons(epsilons)),
                defenses=tuple(_split_list("--defenses", defenses)),
                seeds=seeds,
                rounds=rounds,
                delta=delta,
                jobs=jobs,
                audit=audit,
                min_hr=min_hr,
                data_dir=str(data_dir) if data_dir is not None else None,
                columns=parse_columns(columns),
                eval_negatives=eval_negatives,
                synthetic_users=synthetic_users,
                private_modes=private_modes,
                synthetic_items=synthetic_items,
            )
            try:
                result = _run_with_bar(config, out_dir or Path("report"), run_report)
            except KeyboardInterrupt:
                raise _interrupted(
                    "interrupted; run the same command again to resume the sweep "
                    "(finished cells are reused)"
                ) from None
    for note in result.notes:
        err.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    from securefed.report.html import baseline_flags, summarise

    for sentence in summarise(result.results, min_hr)[0]:
        out.print(sentence, highlight=False, soft_wrap=True)
    for flag in baseline_flags(result.results):
        out.print(f"BELOW a baseline: {flag}", highlight=False, soft_wrap=True)
    out.print(f"report: {result.html}  (table: {result.csv})", highlight=False)


def _run_with_bar(config: Any, target: Path, run_report: Any) -> Any:
    if not err.is_terminal:
        return run_report(config, out=target, progress=_PlainCells())
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("[bold]cells"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
    )
    with Progress(*columns, console=err, transient=False) as progress:
        task: Any = None

        def on_event(ev: Any) -> None:
            nonlocal task
            if ev.kind == "plan":
                if ev.estimate is not None and ev.estimate.cells:
                    progress.console.print(ev.estimate.line(), highlight=False, soft_wrap=True)
                # Reused cells start the bar without a time sample, so the ETA is honest.
                status = f"{ev.done} reused" if ev.done else ""
                task = progress.add_task("cells", total=ev.total, completed=ev.done, status=status)
            elif ev.kind == "start":
                progress.update(task, status=f"{ev.cell}: {ev.stage}")
            elif ev.kind == "round":
                progress.update(task, status=f"{ev.cell}: {ev.stage} round {ev.round}/{ev.rounds}")
            elif ev.kind == "done":
                progress.update(task, completed=ev.done, status=f"{ev.cell} done")

        return run_report(config, out=target, progress=on_event)


class _PlainCells:
    """Sweep progress as plain lines on stderr (a redirected report): the estimate first,
    then one line per finished cell with the time left, re-estimated from the finished
    cells' measured time against their estimate."""

    def __init__(self) -> None:
        self.estimate: Any = None
        self.spent = 0.0  # measured seconds of the cells finished in this sweep
        self.expected = 0.0  # their estimated seconds
        self.left = 0.0

    def _line(self, text: str) -> None:
        err.print(text, highlight=False, soft_wrap=True, markup=False)

    def __call__(self, ev: Any) -> None:
        from securefed.costs import format_seconds

        if ev.kind == "plan":
            reused = f", {ev.done} reused from an earlier sweep" if ev.done else ""
            self._line(f"report: {ev.total} cells{reused}")
            self.estimate = ev.estimate
            if ev.estimate is not None and ev.estimate.cells:
                self._line(ev.estimate.line())
                self.left = sum(ev.estimate.cells.values())
        elif ev.kind == "done":
            est = self.estimate.cells.get(ev.cell, 0.0) if self.estimate is not None else 0.0
            self.spent += ev.seconds
            self.expected += est
            self.left = max(self.left - est, 0.0)
            text = f"cell {ev.done}/{ev.total} {ev.cell} done in {format_seconds(ev.seconds)}"
            if self.left > 0 and self.expected > 0:
                left = self.left * self.spent / self.expected / self.estimate.jobs
                text += f" (about {format_seconds(left)} left)"
            self._line(text)
