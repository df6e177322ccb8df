"""Console helpers shared by every ``securefed`` command module.

Kept apart from :mod:`securefed.cli` so that command modules (audit, report, Flower) can be
imported on their own without importing the app that registers them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from securefed.errors import SecureFedError

# Options that several commands take, with one help text each.
SyntheticUsers = Annotated[int | None, typer.Option(help="Users of the synthetic dataset.")]
SyntheticItems = Annotated[int | None, typer.Option(help="Items of the synthetic dataset.")]
DatasetName = Annotated[
    str, typer.Option(help="synthetic, ml-100k, ml-1m, filmtrust, or a file path.")
]
LocalEpochs = Annotated[int | None, typer.Option(help="FedRAP local epochs per round.")]
Delta = Annotated[float, typer.Option(help="DP delta.")]

err = Console(stderr=True)
out = Console()


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn securefed's own errors into one line and exit code 2."""
    try:
        yield
    except SecureFedError as exc:
        raise _fail(str(exc)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted; resume with --resume RUN_DIR") from None


def _print_summary(result: Any) -> None:
    s = result.summary
    if s.get("synthetic"):
        err.print(
            "[yellow]note:[/] trained on the built-in SYNTHETIC dataset "
            "(use --dataset for real data)"
        )
    table = Table(
        title=f"{s['model']} on {s['dataset']} — {s['rounds']} rounds, {s['seconds']:.1f} s"
    )
    table.add_column("metric")
    table.add_column("validation", justify="right")
    table.add_column("test", justify="right")
    for label, key in (
        ("HR@10 (sampled)", "hr@10"),
        ("NDCG@10 (sampled)", "ndcg@10"),
        ("HR@10 (full ranking)", "full_hr@10"),
        ("NDCG@10 (full ranking)", "full_ndcg@10"),
    ):
        table.add_row(label, _fmt(s.get(f"val_{key}")), _fmt(s.get(f"test_{key}")))
    out.print(table)
    if "selected_round" in s:
        out.print(f"reported round {s['selected_round']} (best validation HR@10)")
    if s.get("epsilon") is not None:
        out.print(
            f"privacy: epsilon {s['epsilon']:.4g} at delta {s['delta']:g} "
            f"({s.get('privacy_unit')}-level, {s.get('accountant')} accountant, "
            f"noise multiplier {s.get('noise_multiplier'):.4g}, clip {s.get('clip'):g})"
        )
    if s.get("stopped"):
        err.print(f"[yellow]stopped early:[/] {s['stopped']}")
    out.print(f"run directory: {result.run_dir}")


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"
