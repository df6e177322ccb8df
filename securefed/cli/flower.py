"""``securefed flower ...``: run the same protocol on Flower (the ``flower`` extra).

Registered by :mod:`securefed.cli.root` as a sub-app::

    from securefed.cli.flower import flower_app
    app.add_typer(flower_app, name="flower")

Commands:

* ``securefed flower simulate`` – Flower's simulation engine, N virtual SuperNodes;
* ``securefed flower local`` – a SuperLink and N SuperNodes as separate processes on
  127.0.0.1, one partition of users each, ``flwr run`` submitting the app;
* ``securefed flower init`` – write a complete config file to edit (secure aggregation on);
* ``securefed flower app`` – write the Flower app directory to submit by hand with
  ``flwr run`` against a SuperLink on other machines (docs/deployment.md);
* ``securefed flower enroll`` / ``directory`` – malicious-mode secure aggregation across
  machines: a node's users' signing keys, and the operator's enrollment directory;
* ``securefed flower yardsticks`` – where the data is: add random, MostPop and DP-MostPop to
  a finished run's summary (the server, which holds no data, leaves them out).

Each takes the run's settings from a securefed TOML config (``--config``, as ``securefed
train --config``; optional: without one the defaults of ``securefed train`` apply) plus a few
common flags (``--model``, ``--dataset``, ``--data-dir``, ``--rounds``, ...); secure
aggregation is always on.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from securefed.cli.common import (
    MODEL_HELP,
    Columns,
    EvalNegatives,
    SyntheticItems,
    SyntheticUsers,
    _print_summary,
    _user_errors,
    err,
    out,
    parse_columns,
    refuse_flags_with_resume,
)
from securefed.errors import ConfigError

flower_app = typer.Typer(
    name="flower",
    help=(
        "Run securefed across processes and machines on Flower (pip install 'securefed\\[flower]')."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[
    Path | None, typer.Option(help="securefed TOML config (as for `securefed train --config`).")
]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Run directory to create.")]
WorkOpt = Annotated[
    Path | None,
    typer.Option(help="Logs, Flower home and node state (default: <out>.flower)."),
]


def _config(
    config: Path | None,
    *,
    model: str | None,
    rounds: int | None,
    seed: int | None,
    epsilon: float | None,
    synthetic_users: int | None,
    synthetic_items: int | None,
    dataset: str | None = None,
    data_dir: Path | None = None,
    columns: list[str] | None = None,
    eval_negatives: int | None = None,
) -> Any:
    from securefed.config import refuse_legacy_secure, refuse_other_model_tables
    from securefed.training import TrainConfig, load_config_file

    raw: dict[str, Any] = load_config_file(config) if config is not None else {}
    refuse_legacy_secure(raw, str(config))
    for key, value in (
        ("model", model),
        ("dataset", dataset),
        ("data_dir", str(data_dir) if data_dir is not None else None),
        ("rounds", rounds),
        ("seed", seed),
        ("synthetic_users", synthetic_users),
        ("synthetic_items", synthetic_items),
        ("eval_negatives", eval_negatives),
    ):
        if value is not None:
            raw[key] = value
    mapped = parse_columns(columns)
    if mapped is not None:  # over the config file's [columns], as train's flag
        raw["columns"] = {**dict(raw.get("columns") or {}), **mapped}
    privacy = dict(raw.get("privacy", {}))
    privacy["secagg"] = True
    if epsilon is not None:
        privacy["epsilon"] = epsilon
    raw["privacy"] = privacy
    cfg = TrainConfig.from_dict(raw)
    refuse_other_model_tables(raw, str(config))
    return cfg


def _config_file(path: Path) -> Any:
    """The config a user gives ``enroll`` or ``app`` for a new run, refused as ``securefed
    train --config`` and ``flower local``/``simulate --config`` refuse it: the legacy ``secure
    = false`` and a table of another model than the one it trains (its settings would go
    unused: ``enroll`` read ``model = "fedrap"`` with a ``[fedals]`` table as a FedRAP run's
    config, found in review)."""
    from securefed.config import refuse_legacy_secure, refuse_other_model_tables
    from securefed.training import TrainConfig, load_config_file

    raw = load_config_file(path)
    refuse_legacy_secure(raw, str(path))
    cfg = TrainConfig.from_dict(raw)
    refuse_other_model_tables(raw, str(path))
    return cfg


def _dirs(config: Any, out_dir: Path | None, work_dir: Path | None) -> tuple[Path, Path]:
    from securefed.training import default_run_dir

    run_dir = out_dir if out_dir is not None else default_run_dir(config)
    return run_dir, work_dir if work_dir is not None else run_dir.with_name(
        run_dir.name + ".flower"
    )


def _show(summary: dict[str, Any], run_dir: Path) -> None:
    class _Result:  # what _print_summary reads
        pass

    res = _Result()
    res.summary = summary  # type: ignore[attr-defined]
    res.run_dir = run_dir  # type: ignore[attr-defined]
    _print_summary(res)


Model = Annotated[str | None, typer.Option(help=MODEL_HELP)]
Dataset = Annotated[
    str | None,
    typer.Option(help="synthetic (default), ml-100k, ml-1m, filmtrust, or a file path."),
]
DataDir = Annotated[
    Path | None,
    typer.Option(help="Folder holding datasets (else $SECUREFED_DATA_DIR, the cache, download)."),
]
Rounds = Annotated[int | None, typer.Option(help="Federated rounds.")]
Seed = Annotated[int | None, typer.Option(help="Root seed (same model as `securefed train`).")]
Eps = Annotated[float | None, typer.Option(help="Target user-level epsilon.")]
Nodes = Annotated[
    int | None,
    typer.Option(
        help="SuperNodes, one partition of users each (default 3; a resume: as recorded)."
    ),
]
Resume = Annotated[
    Path | None,
    typer.Option(
        help="Continue this interrupted Flower run directory from its last checkpoint, with "
        "its recorded settings (the nodes' state is in its work directory, --work-dir).",
    ),
]
StageTimeout = Annotated[
    float, typer.Option(help="Seconds to wait for a stage's replies; silent nodes drop.")
]


@flower_app.command()
def simulate(
    config: ConfigOpt = None,
    nodes: Nodes = None,
    model: Model = None,
    dataset: Dataset = None,
    data_dir: DataDir = None,
    columns: Columns = None,
    eval_negatives: EvalNegatives = None,
    rounds: Rounds = None,
    seed: Seed = None,
    epsilon: Eps = None,
    synthetic_users: SyntheticUsers = None,
    synthetic_items: SyntheticItems = None,
    out_dir: OutOpt = None,
    work_dir: WorkOpt = None,
    stage_timeout: StageTimeout = 120.0,
    resume: Resume = None,
) -> None:
    """Run on Flower's simulation engine (Ray) with N virtual SuperNodes."""
    _deploy(locals(), local=False)


@flower_app.command()
def local(
    config: ConfigOpt = None,
    nodes: Nodes = None,
    model: Model = None,
    dataset: Dataset = None,
    data_dir: DataDir = None,
    columns: Columns = None,
    eval_negatives: EvalNegatives = None,
    rounds: Rounds = None,
    seed: Seed = None,
    epsilon: Eps = None,
    synthetic_users: SyntheticUsers = None,
    synthetic_items: SyntheticItems = None,
    out_dir: OutOpt = None,
    work_dir: WorkOpt = None,
    stage_timeout: StageTimeout = 120.0,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="DEBUGGING ONLY: no TLS and no SuperNode authentication "
            "(by default both are on, with a throwaway CA and node keys made for the run).",
        ),
    ] = False,
    isolation: Annotated[
        str,
        typer.Option(
            help="process (default): one long-lived ClientApp process per SuperNode keeps "
            "torch, the model and the round's secrets in memory across messages; "
            "subprocess: Flower starts a ClientApp process per message (slower).",
        ),
    ] = "process",
    resume: Resume = None,
) -> None:
    """Run a local deployment: a SuperLink and N SuperNodes as processes on 127.0.0.1,
    over TLS with SuperNode authentication (unless --insecure)."""
    _deploy(locals(), local=True)


def _deploy(opts: dict[str, Any], *, local: bool) -> None:
    """The body of ``simulate`` and ``local``: resolve the config, run, show the summary."""
    from securefed.training import RunFinished

    nodes = opts["nodes"]
    resume = opts["resume"]
    with _user_errors():
        from securefed.flower import require_flwr

        require_flwr()  # before any folder is made (it used to leave app/ and securefed.toml)
        if local:  # a bad --isolation before the deployment's banner and folders
            from securefed.flower.deploy import _check_scheduling

            _check_scheduling(opts["isolation"], None)
        if resume is not None:
            given = [k for k in ("config", "out_dir", *_OVERRIDES) if opts[k] is not None]
            refuse_flags_with_resume(given, {"out_dir": "out"})
            try:
                cfg, nodes = _check_resume(resume, nodes)
            except RunFinished as exc:
                out.print(str(exc), highlight=False, soft_wrap=True)
                return
            run_dir, work = _dirs(cfg, resume, opts["work_dir"])
            err.print(f"resuming {run_dir} from its last checkpoint ({nodes} partitions)")
        else:
            nodes = 3 if nodes is None else nodes
            overrides = {k: opts[k] for k in _OVERRIDES}
            cfg = _config(opts["config"], **overrides)
            run_dir, work = _dirs(cfg, opts["out_dir"], opts["work_dir"])
            _check_before_flower(cfg, nodes, run_dir)
        command = "local" if local else "simulate"
        with _stopped_as_interrupt(run_dir, command):
            summary = _launch(
                opts, cfg, nodes, run_dir, work, local=local, resume=resume is not None
            )
    _show(summary, run_dir)


@contextlib.contextmanager
def _stopped_as_interrupt(run_dir: Path, command: str) -> Iterator[None]:
    """SIGTERM (a service manager, ``kill``) stops a deployment as Ctrl-C does: the
    SuperLink and SuperNodes (in their own sessions) are stopped, not orphaned, and the one
    line says how to resume."""
    previous = None
    if threading.current_thread() is threading.main_thread():

        def stop(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except KeyboardInterrupt:
        from securefed import runs

        hint = (
            f"; resume with: securefed flower {command} --resume {run_dir}"
            if (run_dir / runs.CONFIG_FILE).exists()
            else ""
        )
        raise KeyboardInterrupt(f"interrupted: every Flower process was stopped{hint}") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _launch(
    opts: dict[str, Any],
    cfg: Any,
    nodes: int,
    run_dir: Path,
    work: Path,
    *,
    local: bool,
    resume: bool,
) -> dict[str, Any]:
    """Start the local deployment or the simulation and run it to its end, a line per round
    as the server writes it."""
    from securefed.cli.progress import RoundDisplay
    from securefed.flower.deploy import run_local_deployment, run_simulation

    progress = RoundDisplay(plain=True).round
    if not local:
        err.print(f"Flower simulation: {nodes} virtual SuperNodes, work directory {work}")
        return run_simulation(
            cfg,
            run_dir=run_dir,
            nodes=nodes,
            work_dir=work,
            stage_timeout=opts["stage_timeout"],
            resume=resume,
            progress=progress,
        )
    insecure = bool(opts["insecure"])
    security = (
        "no TLS, no node authentication"
        if insecure
        else "TLS (throwaway CA) + SuperNode authentication"
    )
    err.print(
        f"local deployment: 1 SuperLink + {nodes} SuperNodes on 127.0.0.1, {security}, "
        f"logs in {work}"
    )
    if insecure:
        err.print(
            "WARNING: --insecure is for debugging only: no TLS and no SuperNode "
            "authentication; any process that reaches the port can join or listen",
            style="bold red",
        )
    return run_local_deployment(
        cfg,
        run_dir=run_dir,
        nodes=nodes,
        work_dir=work,
        stage_timeout=opts["stage_timeout"],
        insecure=insecure,
        isolation=opts["isolation"],
        resume=resume,
        progress=progress,
    )


def _check_resume(run_dir: Path, nodes: int | None) -> tuple[Any, int]:
    """The recorded config and partition count of the Flower run to resume; ``--nodes``,
    if given, must be that count (each node's users and state depend on it)."""
    from securefed.flower.deploy import check_resumable

    cfg, recorded = check_resumable(run_dir)
    if nodes is not None and nodes != recorded:
        raise ConfigError(
            f"{run_dir} was run on {recorded} nodes (one partition each); resume it with "
            f"--nodes {recorded} or without --nodes"
        )
    return cfg, recorded


def _check_before_flower(cfg: Any, nodes: int, run_dir: Path) -> None:
    """What can be refused before Flower (and Ray) start, which takes a minute: the config,
    the run directory, the dataset (missing, malformed, a catalogue too small for the
    evaluation) and the number of nodes against the users."""
    from securefed import runs
    from securefed.flower.server import check_config
    from securefed.training import check_run_dir_writable, load_split, refuse_foreign_files

    check_config(cfg)
    if (run_dir / runs.CONFIG_FILE).exists():
        raise ConfigError(f"{run_dir} already holds a run; choose another --out")
    refuse_foreign_files(run_dir)
    check_run_dir_writable(run_dir)
    split = load_split(cfg)
    if cfg.privacy.interaction_dp:  # the nodes would refuse it at their first round
        from protocols.dp.dpsgd import check_interaction_delta

        check_interaction_delta(cfg.privacy.delta, n_interactions=split.n_train)
    if not 1 <= nodes <= split.n_users:
        raise ConfigError(
            f"--nodes must be between 1 and the {split.n_users} users of {split.name} (each "
            f"node holds the users of one partition), got {nodes}"
        )


_OVERRIDES = (
    "model",
    "dataset",
    "data_dir",
    "columns",
    "eval_negatives",
    "rounds",
    "seed",
    "epsilon",
    "synthetic_users",
    "synthetic_items",
)


@flower_app.command()
def init(
    path: Annotated[Path, typer.Argument(help="TOML file to write (must not exist).")] = Path(
        "securefed-flower.toml"
    ),
    model: Model = None,
    dataset: Dataset = None,
    data_dir: DataDir = None,
    columns: Columns = None,
    eval_negatives: EvalNegatives = None,
    rounds: Rounds = None,
    seed: Seed = None,
    epsilon: Eps = None,
    synthetic_users: SyntheticUsers = None,
    synthetic_items: SyntheticItems = None,
) -> None:
    """Write a complete config for `flower local/simulate/app --config` (secure aggregation
    on; every setting resolved, to edit)."""
    from securefed import runs

    with _user_errors():
        cfg = _config(None, **{k: v for k, v in locals().items() if k in _OVERRIDES})
        from securefed.flower.server import check_config

        check_config(cfg)
        if path.exists():
            raise ConfigError(f"{path} exists; choose another file or delete it")
        runs.atomic_write_text(path, runs.dumps_toml(cfg.to_dict()))
    out.print(
        f"wrote {path}; run with: securefed flower local --nodes 3 --config {path}",
        highlight=False,
        soft_wrap=True,
    )


@flower_app.command()
def enroll(
    config: Annotated[Path, typer.Option(help="The run's securefed TOML config (its dataset).")],
    state_dir: Annotated[
        Path, typer.Option(help="This node's state directory (its users' private keys stay here).")
    ],
    partition_id: Annotated[int, typer.Option(help="This node's partition.")],
    num_partitions: Annotated[int, typer.Option(help="How many partitions (nodes).")],
    out_file: Annotated[
        Path, typer.Option("--out", help="Public keys file to write (to the operator).")
    ],
) -> None:
    """On a node: create its users' long-term signing keys (malicious-mode secure
    aggregation; kept in --state-dir) and write their public keys for the operator."""
    from securefed.flower.enrollment import enroll_users, write_directory
    from securefed.flower.node import partition_users
    from securefed.training import load_split

    with _user_errors():
        if out_file.exists():
            raise ConfigError(f"{out_file} exists; choose another --out or delete it")
        cfg = _config_file(config)
        users = partition_users(load_split(cfg).n_users, partition_id, num_partitions).tolist()
        write_directory(out_file, enroll_users(users, state_dir))
    out.print(
        f"enrolled {len(users)} users (private keys in {state_dir}); send {out_file} to the "
        "operator, who merges every node's file with `securefed flower directory`",
        highlight=False,
        soft_wrap=True,
    )


@flower_app.command()
def directory(
    public_keys: Annotated[list[Path], typer.Argument(help="Every node's `enroll --out` file.")],
    out_file: Annotated[
        Path, typer.Option("--out", help="Enrollment directory to write (enrollment.json).")
    ],
) -> None:
    """For the operator: merge every node's public keys into the enrollment directory that
    every node (--node-config enrollment=...) and the server (run config enrollment) read."""
    from securefed.flower.enrollment import load_directory, write_directory

    with _user_errors():
        if out_file.exists():
            raise ConfigError(f"{out_file} exists; choose another --out or delete it")
        merged: dict[int, bytes] = {}
        for path in public_keys:
            keys = load_directory(path)
            twice = sorted(set(keys) & set(merged))
            if twice:
                raise ConfigError(
                    f"user {twice[0]} is enrolled in {path} and in an earlier file; give each "
                    "node's file once, from nodes with distinct partitions"
                )
            merged.update(keys)
        write_directory(out_file, merged)
    out.print(f"wrote {out_file}: {len(merged)} users", highlight=False, soft_wrap=True)


@flower_app.command()
def yardsticks(
    run_dir: Annotated[Path, typer.Argument(help="A finished Flower run's directory.")],
    dataset: Annotated[
        str | None,
        typer.Option(help="The run's dataset where it lies here (default: as the run recorded)."),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Where the data is: add random, MostPop and DP-MostPop on the run's split to a finished
    run's summary (its server holds no data and leaves them out), and print it."""
    from securefed.training import add_yardsticks

    with _user_errors():
        summary = add_yardsticks(
            run_dir, dataset=dataset, data_dir=None if data_dir is None else str(data_dir)
        )
    _show(summary, run_dir)


@flower_app.command()
def app(
    app_dir: Annotated[Path, typer.Argument(help="Directory to write the Flower app into.")],
    config: Annotated[Path, typer.Option(help="securefed TOML config (on the SuperLink host).")],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Run directory (created on the SuperLink host).")
    ],
    stage_timeout: StageTimeout = 120.0,
    enrollment: Annotated[
        Path | None,
        typer.Option(
            help="Enrollment directory (`securefed flower directory`) on the SuperLink host: "
            "needed when the config's secagg_mode is malicious."
        ),
    ] = None,
) -> None:
    """Write a Flower app directory to submit with `flwr run APP_DIR <connection>`
    (add `--run-config resume=true` to continue a stopped run)."""
    from securefed.flower.deploy import write_app
    from securefed.flower.enrollment import load_directory
    from securefed.flower.server import check_config

    with _user_errors():
        cfg = _config_file(config)
        check_config(cfg)
        malicious = cfg.privacy.secagg_mode == "malicious"
        if malicious and enrollment is None:
            raise ConfigError(
                "the config's secure aggregation is in malicious mode: give --enrollment "
                "enrollment.json (securefed flower enroll on each node, then flower directory)"
            )
        if enrollment is not None:
            load_directory(enrollment)  # refused now, not when the run starts
        write_app(
            app_dir,
            config_file=config,
            run_dir=out_dir,
            stage_timeout=stage_timeout,
            enrollment=enrollment,
        )
    out.print(f"wrote {app_dir / 'pyproject.toml'}; submit with: flwr run {app_dir} <connection>")
