"""The ``securefed`` command: a thin layer over the public Python API.

Every command turns its flags into the library's typed configs, calls the library, and
renders progress and results with rich. A :class:`~securefed.errors.SecureFedError` (a user
mistake, bad data, an exhausted budget) becomes one clear line on stderr and exit code 2;
Ctrl-C one line and exit code 130; a training run that diverged (NaN or infinite loss or
parameters) its summary and exit code 1; anything else keeps its traceback, because it is a
bug.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from securefed.allocator import keep_large_buffers
from securefed.cli.common import (
    EXIT_RUN_FAILED,
    MODEL_HELP,
    Columns,
    Delta,
    EvalNegatives,
    LocalEpochs,
    OneLineErrors,
    SyntheticItems,
    SyntheticUsers,
    _fail,
    _print_summary,
    _user_errors,
    err,
    out,
    parse_columns,
    parse_params,
    refuse_flags_with_resume,
    ring_noise,
)
from securefed.cli.progress import RoundDisplay, data_summary

if TYPE_CHECKING:
    from securefed.config import TrainConfig
    from securefed.training import RoundRecord, RunStart

app = typer.Typer(
    name="securefed",
    help="Privacy-hardened federated recommendation: train, account, audit, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineErrors,
)


def _print_version(value: bool) -> None:
    """``--version``: the installed distribution's version (importlib.metadata)."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("securefed")
    except PackageNotFoundError:
        text = "unknown (not installed; run pip install -e . in the clone)"
    out.print(f"securefed {text}", highlight=False)
    raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the installed version and exit.",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    """Privacy-hardened federated recommendation: train, account, audit, report."""


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _absolute_if_path(dataset: str | None) -> str | None:
    """``--dataset`` as an absolute path when it names an existing file or folder (a known
    name such as ``ml-100k`` is kept)."""
    from securefed.data.registry import KNOWN_DATASETS

    if dataset is None or dataset in KNOWN_DATASETS or not Path(dataset).exists():
        return dataset
    return str(Path(dataset).resolve())


def _idle_privacy_flag(given: dict[str, Any], cfg: TrainConfig) -> str | None:
    """Why a privacy flag the user typed would change nothing in ``cfg`` (None when each one
    does): a flag that would change nothing is refused rather than ignored (README)."""
    p = cfg.privacy
    if not p.dp:
        for key in ("delta", "accountant", "noise"):
            if key in given:
                return (
                    f"--{key} sets how DP noise is accounted or placed, and this run has no DP; "
                    f"add --epsilon or --noise-multiplier, or drop --{key}"
                )
    if p.prior_share is None:
        for key in ("prior_items", "prior_weight", "prior_weighting"):
            if key in given:
                flag = "--" + key.replace("_", "-")
                return (
                    f"{flag} shapes the private popularity prior, and this run has none; add "
                    f"--private-prior SHARE (with --epsilon), or drop {flag}"
                )
    return None


@app.command()
def train(
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    dataset: Annotated[
        str | None,
        typer.Option(help="synthetic (default), ml-100k, ml-1m, filmtrust, or a file path."),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder holding datasets (else $SECUREFED_DATA_DIR, the cache, download)."
        ),
    ] = None,
    columns: Columns = None,
    rounds: Annotated[
        int | None, typer.Option(help="Rounds (default per model: fedrap 100, mostpop 1, ...).")
    ] = None,
    local_epochs: LocalEpochs = None,
    dim: Annotated[
        int | None, typer.Option(help="Embedding size (FedRAP dim, FedRecGEL GMF dim).")
    ] = None,
    client_fraction: Annotated[
        float | None,
        typer.Option(help="Poisson sampling: each client joins with this probability."),
    ] = None,
    clients_per_round: Annotated[
        int | None, typer.Option(help="Fixed-size cohorts of K clients.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Root seed of every random step.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory to create.")] = None,
    config: Annotated[
        Path | None, typer.Option(help="TOML file with settings (flags override it).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda.")] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue an interrupted run directory (a finished one: says so)."),
    ] = None,
    checkpoint_every: Annotated[
        int | None,
        typer.Option(help="Checkpoint every N rounds (default 10; a Flower run: every round)."),
    ] = None,
    keep_private_state: Annotated[
        bool | None,
        typer.Option(
            "--keep-private-state",
            help="Keep the resume checkpoint (every client's private state) once the run has "
            "finished; by default a finished run keeps only its results and released model.",
        ),
    ] = None,
    eval_every: Annotated[int | None, typer.Option(help="Evaluate every N rounds.")] = None,
    full_eval_every: Annotated[
        int | None,
        typer.Option(
            help="Rank the full catalogue every N evaluated rounds (default per model; the "
            "last round and the selected one always are)."
        ),
    ] = None,
    eval_users: Annotated[
        int | None,
        typer.Option(
            help="Rank a fixed, seeded sample of N users in full instead of every user (large "
            "populations); full-ranking metrics then come with 95% confidence intervals."
        ),
    ] = None,
    eval_negatives: EvalNegatives = None,
    select_on: Annotated[
        str | None,
        typer.Option(
            help="Metric that picks the reported round on validation: sampled HR@10 (default) "
            "or full (full-ranking HR@10, every evaluated round ranked in full); or last (no "
            "selection: the last round)."
        ),
    ] = None,
    negatives_from: Annotated[
        str | None,
        typer.Option(help="train (leak-free default) or history (the official FedRAP protocol)."),
    ] = None,
    curriculum: Annotated[
        str | None, typer.Option(help="FedRAP: tanh (paper) or none (code).")
    ] = None,
    lam: Annotated[float | None, typer.Option("--lambda", help="FedRAP lambda.")] = None,
    mu: Annotated[float | None, typer.Option(help="FedRAP mu.")] = None,
    l2: Annotated[float | None, typer.Option(help="FedRAP weight decay.")] = None,
    lr_network: Annotated[float | None, typer.Option(help="FedRAP scorer learning rate.")] = None,
    lr_args: Annotated[float | None, typer.Option(help="FedRAP C/D learning rate.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="FedRAP local batch size.")] = None,
    sam: Annotated[
        str | None, typer.Option(help="FedRecGEL: on (default) or off (FedNCF).")
    ] = None,
    rho_shared: Annotated[float | None, typer.Option(help="FedRecGEL SAM radius, shared.")] = None,
    rho_private: Annotated[
        float | None, typer.Option(help="FedRecGEL SAM radius, private.")
    ] = None,
    epsilon: Annotated[
        float | None, typer.Option(help="Target epsilon for the run (per --privacy-unit).")
    ] = None,
    privacy_unit: Annotated[
        str | None,
        typer.Option(
            help="user (DP-FedAvg, default) or interaction (client-side DP-SGD, both models)."
        ),
    ] = None,
    example_clip: Annotated[
        float | None,
        typer.Option(help="--privacy-unit interaction: L2 clip of one example's gradient."),
    ] = None,
    delta: Annotated[float | None, typer.Option(help="DP delta (default 1e-5).")] = None,
    noise_multiplier: Annotated[
        float | None, typer.Option(help="Noise multiplier (instead of --epsilon).")
    ] = None,
    clip: Annotated[float | None, typer.Option(help="L2 clip of each client update.")] = None,
    accountant: Annotated[str | None, typer.Option(help="prv (default) or rdp.")] = None,
    noise: Annotated[str | None, typer.Option(help="central or distributed.")] = None,
    replay_from_seed: Annotated[
        bool | None,
        typer.Option(
            "--replay-from-seed",
            help="DP runs: derive DP noise, cohorts and the secagg seed from --seed (bit-for-bit "
            "reproducible; private only against whoever does not know the seed). Experiments "
            "only: by default they come from the OS.",
        ),
    ] = None,
    secure: Annotated[
        bool | None,
        typer.Option(
            "--secure/--no-secure",
            help="Deprecated: OS randomness is the default for DP runs (--no-secure is gone; "
            "see --replay-from-seed).",
            hidden=True,
        ),
    ] = None,
    secagg: Annotated[
        bool | None, typer.Option("--secagg/--no-secagg", help="Secure aggregation.")
    ] = None,
    private_mode: Annotated[
        bool | None,
        typer.Option(
            "--private-mode",
            help="User-level DP at --epsilon, FedRAP/FedRecGEL: the model's private mode, the "
            "settings docs/privacy.md measures against DP-MostPop (FedRAP and FedRecGEL: "
            "--private-prior 0.9 --rounds 10 --client-fraction 0.1); a flag given beside it "
            "wins, as does a value in the --config file. fedals's private mode needs no flag.",
        ),
    ] = None,
    private_prior: Annotated[
        float | None,
        typer.Option(
            help="User-level DP, FedRAP/FedRecGEL: spend this share of --epsilon (in (0, 1)) on "
            "one private popularity count added to the scores (docs/privacy.md)."
        ),
    ] = None,
    prior_items: Annotated[
        int | None, typer.Option(help="--private-prior: items each user counts (default 20).")
    ] = None,
    prior_weight: Annotated[
        float | None,
        typer.Option(
            help="--private-prior: weight of the prior in the scores, per noise std of a "
            "released count (FedRAP and FedRecGEL: default 0.3)."
        ),
    ] = None,
    prior_weighting: Annotated[
        str | None,
        typer.Option(
            help="--private-prior: capped (the default: every item of a user at sqrt(k / n_u) "
            "up to 80 items, beyond that the weight of 80 shared), sqrt (sqrt(k / n_u) at any "
            "n_u) or sample (k sampled items, DP-MostPop's count)."
        ),
    ] = None,
    synthetic_users: SyntheticUsers = None,
    synthetic_items: SyntheticItems = None,
    min_interactions: Annotated[
        int | None, typer.Option(help="Drop users with fewer interactions (default 5).")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="A model hyperparameter as key=value (repeatable), e.g. --param alpha=3.",
        ),
    ] = None,
    dry_run: Annotated[
        bool | None,
        typer.Option(
            "--dry-run",
            help="Load the data, settle the config and calibrate the noise, print the plan "
            "(noise multiplier, cost estimate) and stop: nothing trained, nothing written.",
        ),
    ] = None,
) -> None:
    """Train a recommender (federated, a baseline, or a centralized reference) and write a
    run directory."""
    flags_given = [k for k, v in locals().items() if v is not None and k != "resume"]
    import dataclasses

    from securefed.config import (
        TrainConfig,
        load_config_file,
        refuse_legacy_secure,
        refuse_other_model_tables,
        with_private_mode,
    )
    from securefed.models.registry import DEFAULT_MODEL, get_spec, params_from_flags
    from securefed.training import (
        RunFinished,
        check_resume,
        check_run_dir_writable,
        refuse_foreign_files,
    )
    from securefed.training import train as run_train

    with _user_errors():
        if resume is not None:
            refuse_flags_with_resume(flags_given, {"out_dir": "out", "lam": "lambda"})
            try:
                check_resume(resume)  # one line, before any progress or data
            except RunFinished as exc:
                out.print(str(exc), highlight=False, soft_wrap=True)
                return
            cfg = None
        else:
            _check_secure_flag(secure, replay_from_seed)
            raw: dict[str, Any] = load_config_file(config) if config is not None else {}
            refuse_legacy_secure(raw, str(config))
            top = _given(
                model=model,
                # Paths as absolute ones in config.toml: a resume from another folder reads
                # the same files (a relative --data-dir left it unable to find the data).
                dataset=_absolute_if_path(dataset),
                data_dir=str(Path(data_dir).resolve()) if data_dir else None,
                rounds=rounds,
                seed=seed,
                client_fraction=client_fraction,
                clients_per_round=clients_per_round,
                device=device,
                checkpoint_every=checkpoint_every,
                keep_private_state=keep_private_state,
                eval_every=eval_every,
                full_eval_every=full_eval_every,
                eval_users=eval_users,
                eval_negatives=eval_negatives,
                select_on=select_on,
                synthetic_users=synthetic_users,
                synthetic_items=synthetic_items,
                min_interactions=min_interactions,
            )
            raw.update(top)
            mapped = parse_columns(columns)
            if mapped is not None:  # over the config file's [columns], as --epsilon over [privacy]
                raw["columns"] = {**dict(raw.get("columns") or {}), **mapped}
            if sam is not None and sam not in ("on", "off"):
                raise _fail(f"--sam must be on or off, got {sam!r}")
            model_flags = _given(
                local_epochs=local_epochs,
                dim=dim,
                negatives_from=negatives_from,
                curriculum=curriculum,
                lam=lam,
                mu=mu,
                l2=l2,
                lr_network=lr_network,
                lr_args=lr_args,
                batch_size=batch_size,
                sam=None if sam is None else sam == "on",
                rho_shared=rho_shared,
                rho_private=rho_private,
            )
            given_as = {key: f"--{key.replace('_', '-')}" for key in model_flags}
            given_as["lam"] = "--lambda"
            params = parse_params(param or [])
            both = sorted(set(params) & set(model_flags))
            if both:
                flags = ", ".join(f"{given_as[k]} and --param {k}" for k in both)
                raise _fail(f"{flags} set the same setting; give it once")
            given_as.update({key: f"--param {key}" for key in params})
            model_flags.update(params)
            privacy = _given(
                epsilon=epsilon,
                delta=delta,
                noise_multiplier=noise_multiplier,
                clip=clip,
                privacy_unit=privacy_unit,
                example_clip=example_clip,
                accountant=accountant,
                noise=noise,
                replay=replay_from_seed,
                secagg=secagg,
                prior_share=private_prior,
                prior_items=prior_items,
                prior_weight=prior_weight,
                prior_weighting=prior_weighting,
            )
            if privacy:
                raw["privacy"] = {**dict(raw.get("privacy", {})), **privacy}
            if private_mode:
                raw = with_private_mode(raw)
            if model_flags:
                name = str(raw.get("model", DEFAULT_MODEL))
                spec = get_spec(name)
                table = spec.params_from_mapping(dict(raw.get(name, {})), section=name)
                raw[name] = dataclasses.asdict(
                    params_from_flags(spec, model_flags, table, given_as=given_as)
                )
            cfg = TrainConfig.from_dict(raw)
            if config is not None:
                refuse_other_model_tables(raw, str(config))
            idle = _idle_privacy_flag(privacy, cfg)
            if idle is not None:
                raise _fail(idle)
        target = resume if resume is not None else out_dir
        if target is not None:
            if resume is None:
                refuse_foreign_files(Path(target))  # a run there too: "already holds a run"
            check_run_dir_writable(Path(target))  # one line, before any progress or data
        if dry_run:
            _dry_run(cfg, target)
            return
        _run_with_progress(cfg, out_dir, resume, run_train)


def _dry_run(cfg: Any, target: Path | None = None) -> None:
    """``securefed train --dry-run``: the plan of the run :func:`securefed.training.plan_run`
    settles (data, the model's choices, cost estimate, noise), on stderr and stdout."""
    from securefed.cli.costs import RunCosts
    from securefed.costs import plural
    from securefed.training import plan_run

    display = RoundDisplay(plain=True)
    costs = RunCosts(display._line, target=target)
    costs.check_before_load(cfg)
    plan = plan_run(cfg, before_build=costs.before_build, download_progress=display.download)
    for line in (*data_summary(plan.data), *plan.notes, *costs.plan_lines(plan.model)):
        display._line(line)
    for line in privacy_plan_lines(plan):
        out.print(line, highlight=False, soft_wrap=True)
    out.print(
        f"dry run: {plan.config.model}, {plural(plan.config.rounds, 'round')} planned; nothing "
        "trained, no run directory written (drop --dry-run to train)",
        highlight=False,
        soft_wrap=True,
    )


def privacy_plan_lines(plan: Any) -> list[str]:
    """What a planned run's noise is (:class:`securefed.training.RunPlan`): the multiplier,
    what it was calibrated for or what the given one spends, and the caveats the run's own
    summary prints (noise placement, colluders, amplification, replay)."""
    from securefed.costs import plural
    from securefed.privacy import account

    config, privacy = plan.config, plan.privacy
    sigma = privacy.get("noise_multiplier")
    if not config.spec.federated:
        return ["privacy: none: a centralized reference, fitted on every interaction"]
    if sigma is None:
        sums = "the cohort's sum of updates" if privacy.get("secagg") else "every update"
        return [f"privacy: no DP (no --epsilon or --noise-multiplier): the server learns {sums}"]
    rounds = plural(config.rounds, "round")
    if privacy.get("releases_per_round"):
        rounds += f" of {privacy['releases_per_round']} DP-SGD releases each"
    delta, cap = privacy["delta"], privacy.get("target_epsilon")
    if config.privacy.noise_multiplier is None:
        what = f"epsilon {cap:g} at delta {delta:g} over {rounds}: noise multiplier {sigma:.4g}"
    else:
        what = f"noise multiplier {sigma:.4g} as given, over {rounds}, delta {delta:g}"
        spent = None
        if privacy["placement"] == "central" and privacy["privacy_unit"] == "user":
            users = int(plan.data["users"])
            spent = account(
                noise_multiplier=sigma,
                delta=delta,
                rounds=config.rounds,
                client_fraction=config.cohort(users).sample_rate(users) or 1.0,
                accountant=privacy["accountant"],
            )["epsilon"]
            if privacy.get("prior_share"):
                spent = None  # the prior's release adds to it (the ledger counts both)
        if spent is not None:
            what += f": epsilon {spent:.4g} if every round is released"
        else:
            what += ": epsilon as its ledger counts the releases"
        if cap is not None:
            what += f"; a round that would take it above the cap {cap:g} is not released"
            if spent is not None and spent > cap:
                what += " (the run stops early)"
    line = (
        f"privacy plan: {privacy['privacy_unit']}-level DP, {what} ({privacy['placement']} "
        f"noise, {privacy['accountant']} accountant"
    )
    if privacy.get("clip") is not None:
        line += f", clip {privacy['clip']:g}"
    line += ")"
    if privacy.get("prior_share"):
        line += (
            f"; the popularity prior: one count release at {privacy['prior_share']:g} of the "
            f"budget, noise multiplier {privacy['prior_noise_multiplier']:.4g}"
        )
    lines = [line]
    if privacy.get("placement_note"):
        lines.append(f"noise placement: {privacy['placement_note']}")
    if privacy.get("colluder_fraction") is not None:
        lines.append(
            "noise shares: counted against the server and up to "
            f"{privacy['colluder_fraction']:.3g} of each round's clients colluding with it"
        )
    if privacy.get("amplification"):
        line = f"amplification by sampling: {privacy['amplification']}"
        planned = privacy.get("epsilon_unamplified_planned")
        if planned is not None and ring_noise(privacy):
            line += (
                f"; against the server that samples them: epsilon about {planned:.4g} if "
                "every round is released (cohorts of the expected size, each at its fewest "
                "survivors)"
            )
        elif planned is not None:
            line += (
                f"; against an observer who learns the cohorts: epsilon {planned:.4g} if every "
                "round is released"
            )
        lines.append(line)
    if privacy.get("replay_warning"):
        lines.append(str(privacy["replay_warning"]))
    return lines


def _check_secure_flag(secure: bool | None, replay: bool | None) -> None:
    """``--secure`` is a deprecated no-op (OS randomness is the default); ``--no-secure`` and
    ``--secure --replay-from-seed`` are errors pointing to the flag named for what it does."""
    if secure is None:
        return
    if not secure:
        raise _fail(
            "--no-secure is gone: DP runs draw their noise and cohorts from the OS by default; "
            "to derive them from --seed (experiments only) use --replay-from-seed"
        )
    if replay:
        raise _fail(
            "--secure asks for OS randomness and --replay-from-seed for seeded randomness; "
            "drop one (--secure is the default now)"
        )
    err.print(
        "[yellow]note:[/] --secure is the default now (DP noise and cohorts come from the "
        "OS) and will be removed; drop it",
        highlight=False,
    )


def _run_with_progress(
    cfg: Any, out_dir: Path | None, resume: Path | None, run_train: Callable[..., Any]
) -> None:
    """Train with the data summary and per-round progress on stderr, then the summary.

    Progress is a rich bar on a terminal and one plain line per round when stderr is not one
    (redirected to a file or a pipe). The cost estimate (memory, disk, time) is printed before
    the first round and again after round 1, and recorded in ``estimate.json``; a run whose
    memory estimate exceeds what is available, or whose disk at its largest exceeds the free
    space where it is written, is refused before the model is built
    (:mod:`securefed.cli.costs`). The first Ctrl-C during the rounds lets the round in
    progress finish, checkpoints it and exits 130 with the resume command; a second one stops
    at once (a resume then re-runs the rounds after the last checkpoint). A run that diverged
    (NaN or infinite loss or parameters) prints its summary and exits 1: it ran and failed,
    which is not a refused command (exit 2).
    """
    from securefed.cli.costs import RunCosts

    display = RoundDisplay(plain=not err.is_terminal)
    stop = _StopAfterRound()
    costs = RunCosts(display._line, target=resume if resume is not None else out_dir)
    if cfg is not None:
        costs.check_before_load(cfg)  # synthetic data: refused before it is generated

    def on_start(start: RunStart) -> None:
        display.start(start)  # its notes: a new run's (a resume said them when it started)
        costs.start(start)
        stop.rounds_running = True

    def on_round(rec: RoundRecord) -> None:
        display.round(rec)
        costs.round(rec)
        if stop.requested and rec.round != rec.rounds_planned:
            raise KeyboardInterrupt

    with stop.installed(), display:
        result = run_train(
            cfg,
            out=out_dir,
            resume=resume,
            progress=on_round,
            download_progress=display.download,
            on_start=on_start,
            before_build=costs.before_build,
        )
    costs.finish(result)
    _print_summary(result)
    if result.summary.get("diverged_round") is not None:
        raise typer.Exit(code=EXIT_RUN_FAILED)


class _StopAfterRound:
    """SIGINT while the rounds run: the first asks to stop after the round in progress, a
    second (or one before the rounds start) interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.rounds_running = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.requested or not self.rounds_running:
            raise KeyboardInterrupt
        self.requested = True
        err.print(
            "[yellow]Ctrl-C:[/] stopping after this round, which is then checkpointed; "
            "press Ctrl-C again to stop now",
            highlight=False,
            soft_wrap=True,
        )

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers can only be installed from the main thread
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


@app.command()
def account(
    epsilon: Annotated[
        float | None, typer.Option(help="Target epsilon (gives the noise multiplier).")
    ] = None,
    noise_multiplier: Annotated[
        float | None, typer.Option(help="Noise multiplier (gives epsilon).")
    ] = None,
    delta: Delta = 1e-5,
    rounds: Annotated[
        str, typer.Option(help="Training rounds (an integer; 1e6 notation is accepted).")
    ] = "100",
    client_fraction: Annotated[
        float, typer.Option(help="Poisson sampling rate (1 = everyone).")
    ] = 1.0,
    users: Annotated[
        int | None, typer.Option(help="Number of users (checks delta < 1/users).")
    ] = None,
    accountant: Annotated[str, typer.Option(help="prv or rdp.")] = "prv",
    privacy_unit: Annotated[
        str, typer.Option(help="user (DP-FedAvg) or interaction (client-side DP-SGD).")
    ] = "user",
    model: Annotated[
        str | None,
        typer.Option(help="--privacy-unit interaction: fedrap (default) or fedrecgel."),
    ] = None,
    local_epochs: Annotated[
        int | None,
        typer.Option(help="--privacy-unit interaction, fedrap: local epochs per round [10]."),
    ] = None,
    sam: Annotated[
        bool | None,
        typer.Option(
            "--sam/--no-sam",
            help="--privacy-unit interaction, fedrecgel: SAM (3 releases/step) [on].",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """DP accounting without training: sigma for an epsilon, or the reverse."""
    import json

    from securefed.privacy import account as run_account

    with _user_errors():
        res = run_account(
            epsilon=epsilon,
            noise_multiplier=noise_multiplier,
            delta=delta,
            rounds=_whole_number(rounds, "--rounds"),
            client_fraction=client_fraction,
            users=users,
            accountant=accountant,
            privacy_unit=privacy_unit,
            model=model,
            local_epochs=local_epochs,
            sam=sam,
        )
    if as_json:
        out.print_json(json.dumps(res))
        return
    out.print(
        f"noise multiplier {res['noise_multiplier']:.5g} -> epsilon {res['epsilon']:.5g} at delta "
        f"{res['delta']:g} ({res['rounds']} rounds, sample rate {res['sample_rate']:g}, "
        f"{res['accountant']} accountant, {res['privacy_unit']}-level, {res['steps']} steps)"
    )
    if res["privacy_unit"] == "user":
        note = DISTRIBUTED_NOTE if noise_multiplier is None else DISTRIBUTED_EPSILON_NOTE
        err.print(note, highlight=False, soft_wrap=True)


#: What ``securefed account --epsilon`` computes for user-level DP, and what it does not.
DISTRIBUTED_NOTE = (
    "note: this is the central Gaussian of a run without --secagg (or with --noise central); "
    "a --secagg run adds distributed discrete noise shares and calibrates its own, larger "
    "noise multiplier from the model's dimension and its largest cohort (a few percent "
    "larger with every client every round, up to several times larger with Poisson sampling "
    "at low epsilon over many rounds): `securefed train ... --dry-run` prints it without "
    'training (docs/privacy.md, "Distributed discrete Gaussian")'
)
#: ... and ``securefed account --noise-multiplier``.
DISTRIBUTED_EPSILON_NOTE = (
    "note: this is the central Gaussian of a run without --secagg (or with --noise central); "
    "a --secagg run with distributed discrete noise shares at this noise multiplier spends a "
    "larger epsilon, which its summary prints "
    '(docs/privacy.md, "Distributed discrete Gaussian")'
)


def _whole_number(text: str, flag: str) -> int:
    """A positive integer from ``123`` or ``1e12`` notation (exact integers only)."""
    value: float | int
    try:
        value = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise _fail(f"{flag} must be a positive integer, got {text!r}") from None
    if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
        raise _fail(f"{flag} must be a positive integer, got {text!r}")
    if int(value) < 1:
        raise _fail(f"{flag} must be a positive integer, got {text!r}")
    return int(value)


def _register_optional_commands() -> None:
    """Commands whose modules live beside this one (audit, report, Flower deployment)."""
    from securefed.cli.audit import audit as audit_command
    from securefed.cli.report import report as report_command

    app.command("audit")(audit_command)
    app.command("report")(report_command)
    try:
        from securefed.cli.flower import flower_app
    except ImportError:  # pragma: no cover - the extra is not installed
        return
    app.add_typer(flower_app, name="flower")


_register_optional_commands()


def main() -> None:
    """Console entry point. The allocator settings go first: glibc's arena cap binds only
    threads that have not yet chosen an arena, and torch and numpy start theirs while the
    data loads (``train()`` sets them again, idempotently, for library callers)."""
    keep_large_buffers()
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
