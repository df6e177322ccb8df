"""``securefed.train``: the federated simulation end to end, writing a run directory.

A round reads top to bottom: sample cohort -> local training of all participants (batched)
-> aggregate (the privacy seam) -> server model step -> evaluation -> metrics line ->
checkpoint. Every randomized step takes a generator derived from the run seed and the round,
so a resumed run draws exactly what an uninterrupted one would, except the randomness a DP
claim relies on: a DP run draws its noise, cohorts and secure-aggregation seed from the OS
unless it replays (``PrivacyConfig.replay``; :mod:`securefed.privacy`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import torch

from protocols.seeding import torch_generator
from securefed import runs
from securefed.allocator import keep_large_buffers
from securefed.config import PrivacyConfig, TrainConfig, load_config_file
from securefed.data.registry import load_dataset
from securefed.data.split import leave_one_out
from securefed.data.synthetic import make_synthetic
from securefed.data.types import LoadReport, Split
from securefed.errors import ConfigError, IntegrityError, PrivacyBudgetError
from securefed.evaluation import evaluate_splits
from securefed.federation.aggregation import Aggregator, PlainAggregator
from securefed.federation.base import Recommender
from securefed.federation.cohort import round_cohort
from securefed.models.registry import model_names

#: Every registered model name (``securefed.models.registry``).
MODELS: tuple[str, ...] = model_names()


@dataclass(frozen=True)
class RoundRecord:
    """One line of ``metrics.jsonl``, handed to the progress callback as well."""

    values: dict[str, Any]

    @property
    def round(self) -> int:
        return int(self.values["round"])


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns: the run directory, its summary and per-round metrics."""

    run_dir: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    split: Split
    model: Recommender


ProgressFn = Callable[[RoundRecord], None]


@dataclass(frozen=True)
class RoundView:
    """Everything that happened in one round, for observers (attacks, audits, recorders).

    ``updates`` are the clients' raw uploads as computed on the devices, before clipping,
    noise or masking; an observer that models a threat must apply what that threat model's
    observer would really see (see :mod:`attacks`). ``aggregate`` is what the server learned
    (None when the round was skipped or aborted). ``model`` is the recommender after the
    server step; observers must read only its public (global) state.
    """

    round_index: int
    participants: torch.Tensor
    updates: Any
    aggregate: Any
    model: Recommender
    config: TrainConfig
    global_before: dict[str, torch.Tensor]


class RoundObserver(Protocol):
    """Receives a :class:`RoundView` after every round of :func:`train`."""

    def __call__(self, view: RoundView) -> None: ...


def load_split(config: TrainConfig, *, download_progress: Any = None) -> Split:
    """Load the configured dataset and split it (leave-one-out, 99 sampled negatives)."""
    min_inter = config.resolved_min_interactions()
    if config.dataset == "synthetic":
        from securefed.data.loaders import filter_min_interactions

        data = filter_min_interactions(
            make_synthetic(
                n_users=config.synthetic_users, n_items=config.synthetic_items, seed=config.seed
            ),
            min_inter,
        )
    else:
        data = load_dataset(
            config.dataset,
            data_dir=config.data_dir,
            min_interactions=min_inter,
            seed=config.seed,
            progress=download_progress,
        )
    return leave_one_out(data, seed=config.seed)


def build_model(config: TrainConfig, split: Split) -> Recommender:
    """The configured recommender with its parameters initialised from the run seed."""
    gen = torch_generator(config.seed, "init")
    dpsgd = None
    if config.privacy.interaction_dp:
        from securefed.privacy import interaction_dpsgd

        dpsgd = interaction_dpsgd(config, split)
    return config.spec.build(
        split,
        config.params,
        generator=gen,
        device=config.device,
        dpsgd=dpsgd,
        noise_seed=config.seed,
    )


def build_aggregator(config: TrainConfig, split: Split, model: Recommender) -> Aggregator:
    """The aggregation seam: plain averaging, DP, secure aggregation or both."""
    p = config.privacy
    if not p.dp and not p.secagg:
        return PlainAggregator()
    from securefed.privacy import PrivateAggregator

    return PrivateAggregator(
        config, split, dim=model.layout.size, dpsgd=getattr(model, "dpsgd", None)
    )


def _default_run_dir(config: TrainConfig) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    name = Path(config.dataset).stem if config.dataset not in ("synthetic",) else "synthetic"
    return Path("runs") / f"{stamp}-{config.model}-{name}"


def _evaluate_round(model: Recommender, split: Split, *, full: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    for which, res in evaluate_splits(model, split, k=10, full=full).items():
        out[f"{which}_hr@10"] = res.hr
        out[f"{which}_ndcg@10"] = res.ndcg
        if res.full_hr is not None and res.full_ndcg is not None:
            out[f"{which}_full_hr@10"] = res.full_hr
            out[f"{which}_full_ndcg@10"] = res.full_ndcg
    return out


def _is_better(record: dict[str, Any], best: dict[str, Any] | None) -> bool:
    """The selection rule: best validation HR@10, then NDCG@10; ties go to the later round."""
    if best is None:
        return True
    return (record["val_hr@10"], record["val_ndcg@10"]) >= (best["val_hr@10"], best["val_ndcg@10"])


def _selected_round(metrics: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The metrics line of the round the selection rule picks (None before any evaluation)."""
    best = None
    for m in metrics:
        if "val_hr@10" in m and _is_better(m, best):
            best = m
    return best


SUMMARY_METRICS = (
    "test_hr@10",
    "test_ndcg@10",
    "test_full_hr@10",
    "test_full_ndcg@10",
    "val_hr@10",
    "val_ndcg@10",
    "val_full_hr@10",
    "val_full_ndcg@10",
)


def _summary(
    config: TrainConfig,
    split: Split,
    metrics: list[dict[str, Any]],
    seconds: float,
    aggregator: Aggregator,
    stopped: str | None,
) -> dict[str, Any]:
    evaluated = [m for m in metrics if "val_hr@10" in m]
    summary: dict[str, Any] = {
        "model": config.model,
        "role": config.spec.role,
        "dataset": config.dataset,
        "rounds": len(metrics),
        "rounds_planned": config.rounds,
        "seed": config.seed,
        "seconds": round(seconds, 3),
        "users": split.n_users,
        "items": split.n_items,
        "train_interactions": split.n_train,
        "synthetic": split.report.synthetic,
        "selection": "round with the best validation HR@10 (ties: latest)",
    }
    best = _selected_round(metrics)
    if best is not None:
        summary["selected_round"] = best["round"]
        for key in SUMMARY_METRICS:
            summary[key] = best.get(key)
        last = evaluated[-1]
        for key in SUMMARY_METRICS:
            summary[f"final_{key}"] = last.get(key)
    if stopped:
        summary["stopped"] = stopped
    summary.update(_privacy_summary(aggregator))
    summary.update(_baselines(config, split, summary))
    return summary


def _baselines(config: TrainConfig, split: Split, summary: dict[str, Any]) -> dict[str, Any]:
    """Random, MostPop and (DP runs) DP-MostPop on this split, the lift over MostPop, and in
    words where the run falls below any of them (:mod:`securefed.baselines`)."""
    from securefed.baselines import baseline_metrics, verdict

    p = config.privacy
    epsilon = None
    if p.dp:
        epsilon = p.epsilon if p.epsilon is not None else summary.get("epsilon")
    out = baseline_metrics(
        split, seed=config.seed, epsilon=epsilon, delta=p.delta, privacy_unit=p.privacy_unit
    )
    for key in ("test_hr@10", "test_full_hr@10"):
        ref = out.get(f"baseline_mostpop_{key}")
        value = summary.get(key)
        if value is not None and ref:
            out[f"lift_over_mostpop_{key}"] = value / ref
    out["verdict"] = verdict({**summary, **out})
    return out


def _privacy_summary(aggregator: Aggregator) -> dict[str, Any]:
    describe = getattr(aggregator, "summary", None)
    if describe is None:
        return {"epsilon": None, "privacy_unit": None, "secagg": False}
    return dict(describe())


def train(
    config: TrainConfig | None = None,
    *,
    out: str | Path | None = None,
    resume: str | Path | None = None,
    progress: ProgressFn | None = None,
    download_progress: Any = None,
    split: Split | None = None,
    observer: RoundObserver | None = None,
) -> TrainResult:
    """Train a federated recommender and write a run directory.

    Args:
        config: The run's configuration (defaults: FedRAP on synthetic data). Ignored with
            ``resume``, which reads the run's own ``config.toml``.
        out: Run directory to create (default ``runs/<timestamp>-<model>-<dataset>/``); it
            must not hold another run.
        resume: An interrupted run directory to continue from its last checkpoint.
        progress: Called after every round with that round's metrics.
        download_progress: Passed to the dataset downloader (see ``load_dataset``).
        split: A pre-built split to train on (skips loading; for notebooks and tests).
        observer: Called after every round with a :class:`RoundView` (attacks, audits).

    Returns:
        The run directory, its summary (also in ``summary.json``) and per-round metrics.

    Raises:
        ConfigError: Invalid settings, or ``out`` already holds a run.
        DataError: The dataset is missing or malformed.
        PrivacyBudgetError: Never escapes; a run that would overspend stops cleanly and
            records ``stopped`` in its summary.
    """
    keep_large_buffers()
    started = time.perf_counter()
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / runs.CONFIG_FILE).exists():
            raise ConfigError(
                f"{run_dir} is not a run directory (no {runs.CONFIG_FILE}); check --resume"
            )
        config = TrainConfig.from_dict(load_config_file(run_dir / runs.CONFIG_FILE))
    else:
        config = config or TrainConfig()
        run_dir = Path(out) if out is not None else _default_run_dir(config)
        if (run_dir / runs.CONFIG_FILE).exists() or (run_dir / runs.METRICS_FILE).exists():
            raise ConfigError(
                f"{run_dir} already holds a run; choose another --out or continue it "
                f"with --resume {run_dir}"
            )
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was given but torch sees no GPU here; use --device cpu")
    check_run_dir_writable(run_dir)  # before the data loads: a bad --out fails in a second

    if split is None:
        split = load_split(config, download_progress=download_progress)
    if split.null_positives is not None and not config.privacy.interaction_dp:
        raise ConfigError(
            "the split holds null examples (interaction canaries), which only DP-SGD "
            "training (--privacy-unit interaction with --epsilon or --noise-multiplier) honours"
        )
    federated = config.spec.federated
    if observer is not None and not federated:
        raise ConfigError(
            f"{config.model} is a centralized reference: it has no uploads to observe"
        )
    model = build_model(config, split)
    aggregator = build_aggregator(config, split, model)
    cohort = config.cohort(split.n_users)
    if cohort.kind == "fixed" and cohort.size > split.n_users:
        raise ConfigError(
            f"--clients-per-round {cohort.size} exceeds the {split.n_users} users of the dataset"
        )

    start_round = 0
    elapsed_before = 0.0
    metrics: list[dict[str, Any]] = []
    # Every release is written to the run's ledger file before it leaves the aggregator; a
    # resumed run continues that file, which counts the rounds released after the checkpoint
    # (they are released again, and counted again: docs/privacy.md, "Resume").
    attach = getattr(aggregator, "attach", None)
    if resume is not None and (run_dir / runs.CHECKPOINT_FILE).exists():
        ckpt = runs.load_checkpoint(run_dir)
        # A corrupt best model is refused now, not after the resumed rounds have run.
        runs.load_state(run_dir / runs.BEST_FILE)
        try:
            model.load_state_dict(ckpt["model"])
            aggregator.load_state_dict(ckpt.get("aggregator", {}))
        except (RuntimeError, KeyError, ValueError, TypeError, AttributeError) as exc:
            raise IntegrityError(
                f"{run_dir / runs.CHECKPOINT_FILE} does not fit this run's model and privacy "
                f"settings ({type(exc).__name__}); resume the run it was written by, or start "
                "a new run"
            ) from None
        if attach is not None:
            attach(run_dir, resume=True)
        start_round = int(ckpt["round"])
        elapsed_before = float(ckpt.get("seconds", 0.0))
        metrics = runs.read_metrics(run_dir, upto_round=start_round)
        runs.rewrite_metrics(run_dir, metrics)
    elif resume is not None:
        if attach is not None:
            attach(run_dir, resume=True)
        runs.rewrite_metrics(run_dir, [])
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        runs.atomic_write_text(run_dir / runs.CONFIG_FILE, runs.dumps_toml(config.to_dict()))
        runs.write_json(run_dir / "data.json", _data_record(split.report, split))
        if attach is not None:
            attach(run_dir, resume=False)

    stopped: str | None = None
    train_seconds = sum(m.get("train_seconds", 0.0) for m in metrics)
    best = _selected_round(metrics)
    begin_round = getattr(aggregator, "begin_round", None)
    for r in range(start_round, config.rounds):
        t0 = time.perf_counter()
        if begin_round is not None:
            try:  # client-side DP (interaction unit) is accounted before anyone trains
                begin_round(r)
            except PrivacyBudgetError as exc:
                stopped = str(exc)
                break
        if not federated:
            # A centralized reference: the server fits on every interaction; no uploads.
            stats = model.fit_round(r, torch_generator(config.seed, "train", r))  # type: ignore[attr-defined]
            participants, agg = torch.zeros(0, dtype=torch.long), None
            t1 = time.perf_counter()
        else:
            participants = round_cohort(
                cohort,
                split.n_users,
                seed=config.seed,
                round_index=r,
                secure=config.privacy.os_randomness,
            )
            global_before = public_state(model) if observer is not None else {}
            updates, stats = model.client_round(
                participants, r, torch_generator(config.seed, "train", r)
            )
            try:
                agg = aggregator(updates, r)
            except PrivacyBudgetError as exc:
                stopped = str(exc)
                break
            if agg is not None:
                model.apply_aggregate(agg, r)
            model.end_round(r)
            t1 = time.perf_counter()
            if observer is not None:
                observer(RoundView(r, participants, updates, agg, model, config, global_before))
        record: dict[str, Any] = {
            "round": r + 1,
            "loss": stats.loss,
            "participants": int(participants.shape[0]),
            "contributors": agg.contributors if agg is not None else 0,
            "train_seconds": t1 - t0,
        }
        record.update(_round_privacy(aggregator))
        if (r + 1) % config.eval_every == 0 or r + 1 == config.rounds:
            full = (r + 1) % config.resolved_full_eval_every() == 0 or r + 1 == config.rounds
            record.update(_evaluate_round(model, split, full=full))
            record["eval_seconds"] = time.perf_counter() - t1
            if _is_better(record, best):
                best = record
                if not full:  # keep the model so the selected round gets full-ranking metrics
                    runs.save_state(
                        run_dir / runs.BEST_FILE, {"round": r + 1, "model": model.state_dict()}
                    )
        train_seconds += t1 - t0
        metrics.append(record)
        runs.append_metrics(run_dir, record)
        if (r + 1) % config.checkpoint_every == 0 or r + 1 == config.rounds:
            _checkpoint(
                run_dir, model, aggregator, r + 1, elapsed_before + time.perf_counter() - started
            )
        if progress is not None:
            progress(RoundRecord(record))

    seconds = elapsed_before + time.perf_counter() - started
    if stopped is not None and metrics:
        _checkpoint(run_dir, model, aggregator, metrics[-1]["round"], seconds)
    _complete_selected_round(config, split, metrics, run_dir)
    summary = _summary(config, split, metrics, seconds, aggregator, stopped)
    summary["train_seconds"] = round(train_seconds, 3)
    runs.write_json(run_dir / runs.SUMMARY_FILE, summary)
    return TrainResult(run_dir=run_dir, summary=summary, metrics=metrics, split=split, model=model)


def check_run_dir_writable(run_dir: Path) -> None:
    """Refuse a run directory that cannot be created or written, changing nothing.

    Probes the nearest existing folder on the way to ``run_dir`` with a temporary file (removed
    at once): permission bits alone would pass for root on a read-only file system.

    Raises:
        ConfigError: one line naming the path and what to do.
    """
    probe = run_dir
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(
            f"cannot create the run directory {run_dir}: {probe} is a file, not a folder; "
            "choose another --out"
        )
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".securefed-write-test.")
    except OSError as exc:
        raise ConfigError(
            f"cannot write the run directory {run_dir}: {probe} is not writable "
            f"({exc.strerror or type(exc).__name__}); choose another --out"
        ) from None
    os.close(fd)
    os.unlink(tmp)


def _complete_selected_round(
    config: TrainConfig, split: Split, metrics: list[dict[str, Any]], run_dir: Path
) -> None:
    """Give the selected round full-ranking metrics when it was evaluated sampled-only."""
    best = _selected_round(metrics)
    if best is None or "test_full_hr@10" in best:
        return
    saved = runs.load_state(run_dir / runs.BEST_FILE)
    if saved is None or saved.get("round") != best["round"] or "model" not in saved:
        return
    model = build_model(config, split)
    model.load_state_dict(saved["model"])
    best.update(_evaluate_round(model, split, full=True))
    runs.rewrite_metrics(run_dir, metrics)


def public_state(model: Recommender) -> dict[str, torch.Tensor]:
    """Copies of the model's shared (global) parameters, named as in its update layout."""
    if hasattr(model, "global_parameters"):
        return {k: v.detach().clone() for k, v in model.global_parameters().items()}
    raise TypeError(f"{type(model).__name__} does not expose global_parameters()")


def _round_privacy(aggregator: Aggregator) -> dict[str, Any]:
    latest = getattr(aggregator, "round_record", None)
    return dict(latest()) if latest is not None else {}


def _checkpoint(
    run_dir: Path, model: Recommender, aggregator: Aggregator, rounds_done: int, seconds: float
) -> None:
    runs.save_checkpoint(
        run_dir,
        {
            "round": rounds_done,
            "model": model.state_dict(),
            "aggregator": aggregator.state_dict(),
            "seconds": seconds,
        },
    )
    ledger = getattr(aggregator, "ledger_dicts", None)
    if ledger is not None:
        runs.write_json(run_dir / runs.LEDGER_FILE, ledger())


def _data_record(report: LoadReport, split: Split) -> dict[str, Any]:
    return {
        "name": split.name,
        "users": split.n_users,
        "items": split.n_items,
        "train_interactions": split.n_train,
        "source": report.source,
        "raw_rows": report.raw_rows,
        "duplicate_rows": report.duplicate_rows,
        "dropped_users": report.dropped_users,
        "dropped_interactions": report.dropped_interactions,
        "synthetic": report.synthetic,
        "notes": list(report.notes),
    }


__all__ = [
    "MODELS",
    "check_run_dir_writable",
    "PrivacyConfig",
    "RoundObserver",
    "RoundRecord",
    "RoundView",
    "public_state",
    "TrainConfig",
    "TrainResult",
    "build_aggregator",
    "build_model",
    "load_config_file",
    "load_split",
    "train",
]
