"""``securefed audit``: train (or load) a run, attack it, audit its DP; a thin CLI layer.

Registered by the CLI as ``app.command()(audit)``. Flags become an
:class:`~attacks.audit.AuditConfig`, :func:`attacks.audit.audit` does the work, and the
result is one rich table plus the output paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from securefed.cli.common import (
    MODEL_HELP,
    Columns,
    DatasetName,
    Delta,
    EvalNegatives,
    LocalEpochs,
    SyntheticItems,
    SyntheticUsers,
    _fail,
    _user_errors,
    err,
    escape,
    out,
    parse_columns,
    parse_params,
)

__all__ = ["audit"]


def audit(
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    dataset: DatasetName = "synthetic",
    epsilon: Annotated[
        float | None, typer.Option(help="Target user-level epsilon (omit: no DP).")
    ] = None,
    delta: Delta = 1e-5,
    secagg: Annotated[
        bool, typer.Option("--secagg/--no-secagg", help="Secure aggregation on.")
    ] = False,
    private_prior: Annotated[
        float | None,
        typer.Option(
            help="FedRAP/FedRecGEL under --epsilon: spend this share of it on one private "
            "popularity count first (docs/privacy.md); the audit bounds that release too."
        ),
    ] = None,
    attacks: Annotated[
        str,
        typer.Option(
            help="all, or a comma-separated list (row-change,intersection,imia,released,...)."
        ),
    ] = "all",
    rounds: Annotated[
        int | None,
        typer.Option(help="Federated rounds to train (default 10, or the model's if fewer)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Root seed of every random step.")] = 0,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Audit output directory (default: a new audits/<time>-<model>-<dataset>).",
        ),
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Folder holding datasets.")] = None,
    columns: Columns = None,
    eval_negatives: EvalNegatives = None,
    run: Annotated[
        Path | None,
        typer.Option(
            help="Audit this run directory instead of training (rescores a recording kept "
            "there with --keep-recording, else re-simulates the run)."
        ),
    ] = None,
    keep_recording: Annotated[
        bool,
        typer.Option(
            "--keep-recording",
            help="Keep what the observer recorded (OUT/run/audit/: per-round files and "
            "accumulated statistics, about 25 MB for FedRAP on MovieLens 100K) so "
            "`--run OUT/run` can rescore it; by default it lives in a temporary folder inside "
            "OUT and is removed after scoring. The audit's own training run never keeps its "
            "checkpoint.",
        ),
    ] = False,
    canaries: Annotated[
        int | None,
        typer.Option(help="Canary clients of the DP audit (default 256); 0: no audit."),
    ] = None,
    clients_per_round: Annotated[
        int | None, typer.Option(help="Fixed cohorts of K clients.")
    ] = None,
    local_epochs: LocalEpochs = None,
    synthetic_users: SyntheticUsers = None,
    synthetic_items: SyntheticItems = None,
    target_users: Annotated[int, typer.Option(help="Targets of the optimisation inversion.")] = 16,
    imia_iterations: Annotated[
        int, typer.Option(help="Refinement iterations of the IMIA shadow attack.")
    ] = 5,
    released_iterations: Annotated[
        int, typer.Option(help="L-BFGS iterations of the released-model attack's fit.")
    ] = 30,
    param: Annotated[
        list[str] | None,
        typer.Option("--param", help="A model hyperparameter as key=value (repeatable)."),
    ] = None,
) -> None:
    """Attack a federated run under explicit threat models and audit its privacy."""
    import dataclasses

    from attacks.audit import AuditConfig
    from attacks.audit import audit as run_audit
    from securefed.models.registry import DEFAULT_MODEL, get_spec, params_from_flags
    from securefed.training import TrainConfig

    with _user_errors():
        names = tuple(a.strip() for a in attacks.split(",") if a.strip())
        if run is not None:
            given = {
                "--model": model is not None,
                "--dataset": dataset != "synthetic",
                "--epsilon": epsilon is not None,
                "--secagg": secagg,
                "--private-prior": private_prior is not None,
                "--data-dir": data_dir is not None,
                "--columns": columns is not None,
                "--eval-negatives": eval_negatives is not None,
            }
            clash = [k for k, v in given.items() if v]
            if clash:
                raise _fail(
                    f"--run audits a run with its recorded settings; drop {', '.join(clash)}"
                )
            train_cfg = TrainConfig()
        else:
            spec = get_spec(model or DEFAULT_MODEL)
            from securefed.config import PrivacyConfig

            planned = PrivacyConfig(
                epsilon=epsilon, delta=delta, secagg=secagg, prior_share=private_prior
            )
            n_rounds = rounds if rounds is not None else min(10, spec.rounds_for(planned))
            raw: dict[str, Any] = {
                "model": spec.name,
                "dataset": dataset,
                "rounds": n_rounds,
                "seed": seed,
                "eval_every": n_rounds,
                "checkpoint_every": n_rounds,
            }
            if data_dir is not None:
                raw["data_dir"] = str(data_dir)
            mapped = parse_columns(columns)
            if mapped is not None:
                raw["columns"] = mapped
            if eval_negatives is not None:
                raw["eval_negatives"] = eval_negatives
            if clients_per_round is not None:
                raw["clients_per_round"] = clients_per_round
            for key, value in (
                ("synthetic_users", synthetic_users),
                ("synthetic_items", synthetic_items),
            ):
                if value is not None:
                    raw[key] = value
            flags = parse_params(param or [])
            given_as = {key: f"--param {key}" for key in flags}
            if local_epochs is not None:
                flags["local_epochs"] = local_epochs
                given_as["local_epochs"] = "--local-epochs"
            if flags:
                raw[spec.name] = dataclasses.asdict(
                    params_from_flags(spec, flags, given_as=given_as)
                )
            raw["privacy"] = {
                "epsilon": epsilon,
                "delta": delta,
                "secagg": secagg,
                "prior_share": private_prior,
            }
            raw["privacy"] = {k: v for k, v in raw["privacy"].items() if v is not None}
            train_cfg = TrainConfig.from_dict(raw)
        cfg = AuditConfig(
            train=train_cfg,
            attacks=names,
            run=str(run) if run is not None else None,
            canaries=canaries,
            target_users=target_users,
            imia_iterations=imia_iterations,
            released_iterations=released_iterations,
            keep_recording=keep_recording,
        )
        if out_dir is None:  # a fresh directory per audit, as train's runs/<...>
            from attacks.audit import default_audit_dir

            out_dir = default_audit_dir(cfg)
        before_train, progress = _announce()
        if err.is_terminal:
            with err.status("training and recording what each observer sees ..."):
                result = run_audit(cfg, out=out_dir, before_train=before_train)
        else:
            result = run_audit(cfg, out=out_dir, progress=progress, before_train=before_train)
    _print(result)


def _announce() -> tuple[Any, Any]:
    """``before_train``: the replay training's estimate (one line) or a refusal when it cannot
    fit; ``progress``: a plain line per round (for stderr that is not a terminal)."""

    def before_train(train_cfg: Any, split: Any, setup: Any) -> None:
        from attacks.audit import estimate_audit_seconds
        from securefed.costs import (
            RunShape,
            check_memory,
            estimate_run,
            format_bytes,
            format_seconds,
        )

        est = estimate_run(train_cfg, RunShape.of(split))
        check_memory(train_cfg, est)
        whole = estimate_audit_seconds(
            train_cfg,
            split.n_users,
            split.n_items,
            est.seconds,
            full_eval_seconds=est.full_eval_seconds,
            speed=est.speed,
            canaries=setup.canaries,
            canaries_included=True,
            attacks=setup.attacks,
        )
        arrays = setup.array_bytes
        tables = f" and {format_bytes(arrays)} of attack statistics and scores" if arrays else ""
        disk = setup.disk
        written = (
            f"disk {format_bytes(disk.peak)} at most with the observers' recording and the "
            f"scores, {format_bytes(disk.kept)} kept"
            if disk is not None
            else f"disk {format_bytes(est.disk_bytes)} plus the observers' recording"
        )
        err.print(
            f"estimate: the audit's replay training {format_seconds(est.seconds)} (peak memory "
            f"{format_bytes(est.peak_memory)}{tables}, {written}), about "
            f"{format_seconds(whole)} with the attacks ({est.basis})",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )

    def on_round(rec: Any) -> None:
        seconds = rec.values.get("train_seconds", 0.0) + rec.values.get("eval_seconds", 0.0)
        err.print(
            f"audit replay round {rec.round}/{rec.rounds_planned or '?'} ({seconds:.1f} s)",
            highlight=False,
            markup=False,
        )

    return before_train, on_round


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.3f}"
    return str(value)


def _with_base(value: Any, base: Any) -> str:
    """A metric next to what a random guesser scores (``0.982 (0.981)``)."""
    if value is None:
        return "-"
    return f"{_num(value)} ({_num(base)})" if base is not None else _num(value)


def _print(result: Any) -> None:
    from attacks.results import auc_verdict

    rep = result.report
    title = (
        f"attacks on {rep['model']} / {rep['dataset']} "
        f"(epsilon {_num(rep['epsilon'])}, secagg {'on' if rep['secagg'] else 'off'}, "
        f"{rep['rounds']} rounds)"
    )
    table = Table(title=title)
    for col in (
        "attack",
        "threat model",
        "AUC [95% CI]",
        "vs chance",
        "TPR@1%FPR (random)",
        "F1 (random)",
        "extra",
    ):
        left = col in ("attack", "threat model", "extra")
        table.add_column(
            col, justify="left" if left else "right", no_wrap=col not in ("vs chance", "extra")
        )
    aside: list[str] = []  # attacks with no row: skipped, or nothing in the run to score
    for a in rep["attacks"]:
        m, ci, base = a["metrics"], a["ci95"], a["baseline"]
        if not m:
            aside.append(f"{a['name']} ({a['threat_model']}): {a['note']}")
            continue
        auc_value = m.get("auc")
        if isinstance(auc_value, float) and auc_value != auc_value:  # NaN: nothing observed
            aside.append(
                f"{a['name']} ({a['threat_model']}): nothing in this run to score "
                f"({m.get('users', 0)} users observed); {a['note']}"
            )
            continue
        auc_ci = ci.get("auc", [None, None])
        auc = f"{_num(auc_value)} [{_num(auc_ci[0])}, {_num(auc_ci[1])}]"
        extra = ""
        if "embedding_cosine" in m:
            extra = f"cosine {_num(m['embedding_cosine'])}"
        elif "touched_auc" in m:
            extra = f"touched-row AUC {_num(m['touched_auc'])}"
        elif "uncalibrated_auc" in m:
            extra = f"uncalibrated AUC {_num(m['uncalibrated_auc'])}"
        elif "macro_f1" in m:
            extra = "macro-F1 (random: the majority class)"
        verdict = a.get("verdict") or auc_verdict(m, ci, base)
        if verdict == "BELOW CHANCE":
            verdict = "[bold red]BELOW CHANCE[/]: a broken attack, not evidence of privacy"
        f1_key = "f1" if "f1" in m else "macro_f1"
        table.add_row(
            a["name"],
            a["threat_model"],
            auc,
            verdict,
            _with_base(m.get("tpr@1%fpr"), base.get("tpr@1%fpr")),
            _with_base(m.get(f1_key), base.get(f1_key)),
            extra,
        )
    out.print(table)
    for line in aside:
        out.print(f"not in the table: {escape(line)}")
    uploads_read = any(
        a["metrics"] and a["threat_model"] == "upload-observer" for a in rep["attacks"]
    )
    user_level = rep.get("config", {}).get("privacy", {}).get("privacy_unit", "user") == "user"
    if (
        uploads_read
        and user_level
        and rep.get("accounted_epsilon") is not None
        and not rep.get("secagg")
    ):
        out.print(
            "upload-observer rows read each client's upload as the server receives it (with "
            "central noise, before any is added; with distributed noise, with that client's "
            "share only): the run's DP protects what is released, not the uploads, from the "
            "server (--secagg hides them; docs/attacks.md)",
            highlight=False,
        )
    block = rep.get("audit")
    if block is not None:
        out.print(
            f"empirical epsilon >= {block['epsilon_lower_bound']:.3f} at "
            f"{block['confidence']:.0%} confidence ({block['canaries']} canaries; "
            f"Clopper-Pearson {block['clopper_pearson']:.3f}, one-run {block['one_run']:.3f}); "
            f"accounted epsilon {_num(rep['accounted_epsilon'])}"
            + (
                f" (amplified by sampling; {_num(block['accounted_epsilon_unamplified'])} "
                "against an adversary who knows the cohorts, as this test does)"
                if block.get("accounted_epsilon_unamplified") is not None
                else ""
            )
        )
        releases = block.get("releases", {})
        if len(releases) > 1:
            parts = ", ".join(
                f"{name} {r['epsilon_lower_bound']:.3f} (canary AUC {_num(r['canary_auc'])})"
                for name, r in releases.items()
            )
            out.print(
                f"per release kind, each at {releases['rounds']['confidence']:.1%} confidence: "
                f"{parts}"
            )
    mb = result.bytes_recorded / 2**20
    kept = "kept" if result.kept_recording else "removed after scoring; --keep-recording keeps it"
    out.print(
        f"recorded {mb:.1f} MiB of observer data ({kept}); report: {result.out_dir / 'audit.json'}"
    )
