"""Console helpers shared by every ``securefed`` command module.

Kept apart from :mod:`securefed.cli.root` so that command modules (audit, report, Flower) can be
imported on their own without importing the app that registers them.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from securefed.errors import SecureFedError
from securefed.models.registry import model_names

# Options that several commands take, with one help text each.
SyntheticUsers = Annotated[int | None, typer.Option(help="Users of the synthetic dataset.")]
SyntheticItems = Annotated[int | None, typer.Option(help="Items of the synthetic dataset.")]
DatasetName = Annotated[
    str, typer.Option(help="synthetic, ml-100k, ml-1m, filmtrust, or a file path.")
]
Columns = Annotated[
    list[str] | None,
    typer.Option(
        "--columns",
        help="Your table's column names for user, item and timestamp, e.g. --columns "
        "user=customer_id,item=product_sku (a role left out: the column named after it).",
    ),
]
EvalNegatives = Annotated[
    int | None,
    typer.Option(
        help="Sampled negatives per held-out item in evaluation (default 99; at least 10): "
        "fewer for a catalogue too small to draw 99 items a user has not seen."
    ),
]
LocalEpochs = Annotated[int | None, typer.Option(help="FedRAP local epochs per round.")]
#: Model names come from the registry, listed without importing any model code.
MODEL_HELP = f"One of {', '.join(model_names())} (docs/models.md)."
Delta = Annotated[float, typer.Option(help="DP delta.")]

#: Columns of output that goes to a file or a pipe (rich's own default there is 80, which
#: wraps the result tables' cells over several lines); ``COLUMNS`` still wins.
LOG_WIDTH = 140


def _console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = LOG_WIDTH
    return console


err = _console(stderr=True)
out = _console()


def parse_columns(items: list[str] | None) -> dict[str, str] | None:
    """``--columns`` as one mapping (:func:`securefed.data.loaders.parse_columns`), None
    where not given."""
    if not items:
        return None
    from securefed.data.loaders import parse_columns as parse

    return parse(items)


def parse_params(items: list[str]) -> dict[str, Any]:
    """``--param key=value`` pairs; values read as TOML (``3``, ``0.5``, ``true``, ``"x"``),
    else kept as strings."""
    import tomllib

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise _fail(f"--param takes key=value, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = value.strip()
    return out


#: Exit codes: 2 a refused command (a SecureFedError: bad flags, data or budget; one line),
#: 1 a run that went ahead and failed (it diverged: its directory keeps what it did), 130 Ctrl-C
#: (128 + SIGINT, the shell's convention). A traceback (a bug) exits 1 as well.
EXIT_USER_ERROR = 2
EXIT_RUN_FAILED = 1
EXIT_INTERRUPTED = 130


def usage_line(exc: click.UsageError, fallback: str = "securefed") -> str:
    """One line for a command line that does not parse: what is wrong and where the help is
    (``No such option '--epslion' (did you mean '--epsilon'?); see securefed train --help``).
    ``fallback`` names the command when click's error carries no context (an option missing
    its value)."""
    sentences: list[str] = []
    for sentence in re.split(r"(?<=[.?])\s+", " ".join(exc.format_message().split())):
        if sentence not in sentences:  # typer and click can both suggest the same command
            sentences.append(sentence)
    text = " ".join(sentences).rstrip(".")
    path = exc.ctx.command_path if exc.ctx is not None else fallback
    return f"{text}; see {path} --help"


class OneLineErrors(TyperGroup):
    """The app's group: a command line that does not parse (unknown option or command, a
    value of the wrong type, a missing argument) is refused in one line on stderr with exit
    code 2, like every other user mistake, instead of click's usage box. ``securefed`` or
    ``securefed flower`` without a command still prints its help."""

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        *,
        standalone_mode: bool = True,
        **kwargs: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, standalone_mode=False, **kwargs)
        try:
            code = super().main(args, prog_name, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(0)
        except click.UsageError as exc:
            line = usage_line(exc, self._command_named(args, prog_name))
            err.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
            sys.exit(EXIT_USER_ERROR)
        except click.ClickException as exc:
            err.print(
                f"[bold red]error:[/] {escape(exc.format_message())}",
                highlight=False,
                soft_wrap=True,
            )
            sys.exit(exc.exit_code)
        except click.Abort:
            err.print("aborted", highlight=False)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def _command_named(self, args: Any, prog_name: str | None) -> str:
        """``securefed train`` for ``securefed train --rounds``: the (sub)command the
        command line names, as far as it names one."""
        words = list(args) if args is not None else sys.argv[1:]
        path = [str(prog_name or self.name or "securefed")]
        command: click.Command = self
        for word in words:
            if not isinstance(command, click.Group) or word not in command.commands:
                break
            path.append(word)
            command = command.commands[word]
        return " ".join(path)


def _fail(message: str) -> typer.Exit:
    # The message is text, not markup: "[clients x d]" in it must print as written.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=EXIT_USER_ERROR)


def refuse_flags_with_resume(given: list[str], renamed: dict[str, str] | None = None) -> None:
    """``--resume`` continues a run with its recorded settings: any setting flag beside it
    (parameter names in ``given``; ``renamed`` maps a parameter to its flag's name) is
    refused in one line."""
    if given:
        names = renamed or {}
        flags = ", ".join("--" + names.get(g, g).replace("_", "-") for g in given)
        raise _fail(f"--resume continues a run with its recorded settings; drop {flags}")


def _interrupted(message: str) -> typer.Exit:
    """One line on stderr and exit code 130 for Ctrl-C."""
    err.print(f"[bold yellow]{escape(message)}[/]", highlight=False, soft_wrap=True)
    return typer.Exit(code=EXIT_INTERRUPTED)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn securefed's own errors into one line and exit code 2, and Ctrl-C into one line
    and exit code 130 (a training run's interrupt says where the run stands and how to
    resume it: :class:`securefed.training.RunInterrupted`)."""
    try:
        yield
    except SecureFedError as exc:
        raise _fail(str(exc)) from None
    except KeyboardInterrupt as exc:
        raise _interrupted(str(exc) or "interrupted (Ctrl-C)") from None


def _print_summary(result: Any) -> None:
    s = result.summary
    if s.get("synthetic"):
        err.print(
            "[yellow]note:[/] trained on the built-in SYNTHETIC dataset "
            "(use --dataset for real data)"
        )
    role = s.get("role", "federated")
    label = s["model"] + (
        " (CENTRALIZED reference: the server sees all data)" if role == "centralized" else ""
    )
    table = Table(title=f"{label} on {s['dataset']} — {s['rounds']} rounds, {s['seconds']:.1f} s")
    table.add_column("metric")
    table.add_column("validation", justify="right")
    table.add_column("test", justify="right")
    refs = [("random", "random"), ("mostpop", "MostPop")]
    if s.get("baseline_dp_mostpop_test_hr@10") is not None:
        refs.append(("dp_mostpop", f"DP-MostPop eps {s['baseline_dp_mostpop_epsilon']:.3g}"))
    for _, title in refs:
        table.add_column(f"test, {title}", justify="right", style="dim")
    # Sampled among the papers' 99 negatives, unless the run drew another number.
    sampled = f"sampled, {s['eval_negatives']} negatives" if s.get("eval_negatives") else "sampled"
    for label_, key in (
        (f"HR@10 ({sampled})", "hr@10"),
        (f"NDCG@10 ({sampled})", "ndcg@10"),
        ("HR@10 (full ranking)", "full_hr@10"),
        ("NDCG@10 (full ranking)", "full_ndcg@10"),
    ):
        table.add_row(
            label_,
            _fmt(s.get(f"val_{key}")),
            _fmt(s.get(f"test_{key}")),
            *(_fmt(s.get(f"baseline_{name}_test_{key}")) for name, _ in refs),
        )
    out.print(table)
    if s.get("full_eval_users"):
        ci = s.get("test_full_hr@10_ci95") or [None, None]
        out.print(
            f"full ranking over a fixed sample of {s['full_eval_users']:,} of "
            f"{s.get('users', 0):,} users (--eval-users; the baselines on the same users): test "
            f"full HR@10 95% interval [{_fmt(ci[0])}, {_fmt(ci[1])}]"
        )
    lift = s.get("lift_over_mostpop_test_hr@10")
    lift_full = s.get("lift_over_mostpop_test_full_hr@10")
    if lift is not None:
        text = f"lift over MostPop on the same split: x{lift:.2f} sampled HR@10"
        if lift_full is not None:
            text += f", x{lift_full:.2f} full-ranking HR@10"
        out.print(text)
    for line in s.get("model_notes", []):
        out.print(line, highlight=False)
    for line in s.get("verdict", []):
        err.print(f"[bold yellow]{line}[/]")
    hint = private_mode_hint(s)
    if hint:
        err.print(hint)
    if s.get("baseline_dp_mostpop_test_hr@10") is not None:
        out.print(
            "DP-MostPop: one count release at the same epsilon, drawn from the run's seed (the "
            "same draw in every run of this split and seed), a reference not charged to this "
            "run's budget"
        )
    if "selected_round" in s:
        if s.get("select_on") == "last":
            text = f"reported round {s['selected_round']} (the last evaluated round: no choice)"
        elif s.get("rounds") == 1:  # MostPop's one release: nothing to choose among
            text = f"reported round {s['selected_round']} (the only round: no choice)"
        else:
            full = s.get("select_on") == "full"
            metric = "full-ranking HR@10" if full else "HR@10"
            text = f"reported round {s['selected_round']} (best validation {metric})"
            last = s.get("final_test_full_hr@10" if full else "final_test_hr@10")
            if last is not None and s["selected_round"] != s["rounds"]:
                text += f"; the last round ({s['rounds']}) has test {metric} {last:.4f}"
            if s.get("epsilon") is not None:
                text += (
                    "; a choice made on the clear validation data, outside the epsilon "
                    "(docs/privacy.md, 'What the printed epsilon covers')"
                )
        out.print(text)
    for line in s.get("released_verdict", []):
        err.print(f"[bold yellow]{line}[/]")
    if s.get("epsilon") is not None:
        if s.get("noise_multipliers"):  # a resumed run's releases used more than one
            used = s["noise_multipliers"]
            sigma = f"noise multiplier{'s' * (len(used) > 1)} " + ", ".join(
                f"{z:.4g}" for z in used
            )
        else:
            sigma = f"noise multiplier {s.get('noise_multiplier'):.4g}"
        head = f"epsilon {s['epsilon']:.4g} at delta {s['delta']:g}"
        if s.get("epsilon_unamplified") is not None:
            # Amplification by sampling holds only against those who do not learn the cohorts;
            # whoever does gets the unamplified number, said in the same line. With noise
            # shares inside secure aggregation that is the server that samples them (first);
            # with central noise the server is trusted and sees the sums, so an observer.
            amplified = f"epsilon {s['epsilon']:.4g} amplified by sampling"
            unamplified = f"epsilon {s['epsilon_unamplified']:.4g}"
            if ring_noise(s):
                head = (
                    f"{unamplified} against the server that samples the cohorts, {amplified} "
                    f"against others, at delta {s['delta']:g}"
                )
            else:
                head = (
                    f"{amplified}, {unamplified} against an observer who learns the cohorts, "
                    f"at delta {s['delta']:g}"
                )
        clip = (
            "clips " + ", ".join(f"{c:g}" for c in s["clips"])
            if s.get("clips")
            else f"clip {s.get('clip'):g}"
        )
        out.print(
            f"privacy: {head} ({s.get('privacy_unit')}-level, {s.get('accountant')} "
            f"accountant, {sigma}, {clip})"
        )
    if s.get("placement_note") and s.get("epsilon") is not None:
        out.print(f"noise placement: {s['placement_note']}", highlight=False)
    if s.get("colluder_fraction") is not None and s.get("epsilon") is not None:
        colluders = s["colluder_fraction"]
        out.print(
            "noise shares: counted against the server and up to "
            f"{colluders:.3g} of each round's clients colluding with it (their shares are not "
            "counted as noise; secagg_corrupt)"
            if colluders
            else "noise shares: counted against the server alone (secagg_corrupt 0: no client "
            "is assumed to collude with it)",
            highlight=False,
        )
    if s.get("amplification") and s.get("epsilon") is not None:
        out.print(f"amplification by sampling: {s['amplification']}", highlight=False)
    if s.get("replay_warning"):
        err.print(f"[bold red]{s['replay_warning']}[/]", highlight=False)
    elif s.get("randomness") == "os":
        out.print(
            "randomness: DP noise and cohorts drawn from the OS, not stored (no seed "
            "regenerates them)",
            highlight=False,
        )
    if s.get("stopped"):
        err.print(f"[yellow]stopped early:[/] {s['stopped']}")
    if s.get("aborted_rounds"):
        rounds = s["aborted_rounds"]
        err.print(
            f"[bold yellow]{len(rounds)} of {s['rounds']} rounds aborted[/] (no aggregate "
            f"reached the shared model; rounds {', '.join(map(str, rounds))}): "
            f"{escape(s['aborted_reason'])}",
            highlight=False,
            soft_wrap=True,
        )
    out.print(f"run directory: {result.run_dir}")


def ring_noise(privacy: dict[str, Any]) -> bool:
    """Whether a run's (or a plan's) summary has user-level noise drawn as shares inside
    secure aggregation: the one placement whose guarantee holds against the server."""
    return bool(
        privacy.get("secagg")
        and privacy.get("placement") == "distributed"
        and privacy.get("privacy_unit") == "user"
    )


def private_mode_hint(summary: dict[str, Any]) -> str | None:
    """For an in-process user-level run at a target epsilon, of a model with a popularity-prior
    mode, that ended below DP-MostPop without it: the flags of a new run in that mode (None
    otherwise; the prior's release needs central noise, which a Flower run cannot have and a
    run with noise inside secure aggregation chose not to)."""
    from securefed.models.registry import get_spec

    below = any(line.startswith("BELOW DP-MostPop") for line in summary.get("verdict", []))
    model = summary.get("model")
    target = summary.get("target_epsilon")
    if not below or summary.get("prior_share") is not None or model not in model_names():
        return None
    if summary.get("engine") == "flower" or target is None:
        return None
    mode = get_spec(model).private_mode
    if summary.get("privacy_unit") != "user" or mode is None:
        return None
    if summary.get("secagg") and summary.get("placement") != "central":
        # The prior's release needs central noise: the server would see the exact count sum,
        # which a run with noise inside secure aggregation was chosen not to allow.
        return None
    return (
        f"{model}'s private mode adds a private popularity count to its scores; a new run: "
        f"--epsilon {target:g} --private-mode ({mode.flags()}), no --noise-multiplier "
        "(docs/privacy.md, 'Private FedRAP and FedRecGEL', measures it against DP-MostPop)"
    )


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"
