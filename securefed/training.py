"""``securefed.train``: the federated simulation end to end, writing a run directory.

A round reads top to bottom: sample cohort -> local training of all participants (batched)
-> aggregate (the privacy seam) -> server model step -> evaluation -> metrics line ->
checkpoint. Every randomized step takes a generator derived from the run seed and the round,
so a resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import math
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from protocols.seeding import torch_generator
from securefed import runs
from securefed.allocator import keep_large_buffers
from securefed.data.registry import load_dataset
from securefed.data.split import leave_one_out
from securefed.data.synthetic import make_synthetic
from securefed.data.types import LoadReport, Split
from securefed.errors import ConfigError, PrivacyBudgetError
from securefed.evaluation import evaluate_splits
from securefed.federation.aggregation import Aggregator, PlainAggregator
from securefed.federation.base import Recommender
from securefed.federation.cohort import CohortSpec, sample_cohort
from securefed.models.fedrap import FedRAP, FedRAPConfig
from securefed.models.fedrecgel import FedRecGEL, FedRecGELConfig

ModelName = Literal["fedrap", "fedrecgel"]
MODELS: tuple[str, ...] = ("fedrap", "fedrecgel")
DEFAULT_ROUNDS = 100


@dataclass(frozen=True, kw_only=True)
class PrivacyConfig:
    """Differential privacy and secure aggregation settings of a run (off by default).

    ``epsilon`` alone calibrates the noise multiplier for the configured rounds and sampling;
    ``noise_multiplier`` alone fixes it and reports the epsilon spent; both together fix the
    noise and treat ``epsilon`` as a budget cap: a round that would overspend is refused and
    the run stops cleanly (``summary["stopped"]``) with its checkpoint kept.

    ``privacy_unit="interaction"`` (FedRAP and FedRecGEL) makes the clients run DP-SGD on their own
    interactions: ``epsilon``/``noise_multiplier`` then refer to one interaction, and
    ``example_clip`` bounds one example's gradient. No user-level noise is added in that
    mode (one unit per run); ``clip`` is then only the secure-aggregation input bound.
    """

    epsilon: float | None = None
    delta: float = 1e-5
    noise_multiplier: float | None = None
    clip: float | None = None
    accountant: Literal["prv", "rdp"] | None = None
    noise: Literal["central", "distributed"] | None = None
    privacy_unit: Literal["user", "interaction"] = "user"
    example_clip: float | None = None
    secure: bool = False
    secagg: bool = False
    secagg_neighbours: int | None = None
    secagg_dropout: float = 0.05
    secagg_corrupt: float = 0.05
    secagg_scale_bits: int = 16
    secagg_simulate_dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.epsilon is not None and not (self.epsilon > 0):
            raise ConfigError(f"epsilon must be > 0, got {self.epsilon!r}")
        if self.noise_multiplier is not None and not (self.noise_multiplier >= 0):
            raise ConfigError(f"noise multiplier must be >= 0, got {self.noise_multiplier!r}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"delta must be in (0, 1), got {self.delta!r}")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip > 0):
            raise ConfigError(f"clip must be a finite number > 0, got {self.clip!r}")
        if self.accountant not in (None, "prv", "rdp"):
            raise ConfigError(f"accountant must be prv or rdp, got {self.accountant!r}")
        if self.noise not in (None, "central", "distributed"):
            raise ConfigError(f"noise must be central or distributed, got {self.noise!r}")
        if self.privacy_unit not in ("user", "interaction"):
            raise ConfigError(
                f"privacy unit must be user or interaction, got {self.privacy_unit!r}"
            )
        if self.example_clip is not None and not (
            isinstance(self.example_clip, int | float)
            and math.isfinite(self.example_clip)
            and self.example_clip > 0
        ):
            raise ConfigError(
                f"example clip must be a finite number > 0, got {self.example_clip!r}"
            )
        if self.privacy_unit == "interaction":
            if not self.dp:
                raise ConfigError(
                    "--privacy-unit interaction runs DP-SGD on each client; give --epsilon "
                    "or --noise-multiplier"
                )
            if self.noise is not None:
                raise ConfigError(
                    "--noise places user-level noise; with --privacy-unit interaction the "
                    "clients add DP-SGD noise themselves; drop --noise"
                )
            if self.clip is not None and not self.secagg:
                raise ConfigError(
                    "--clip bounds user-level updates; with --privacy-unit interaction use "
                    "--example-clip (--clip is only the input bound of --secagg)"
                )
        elif self.example_clip is not None:
            raise ConfigError(
                "--example-clip is the DP-SGD clip of --privacy-unit interaction; for "
                "user-level DP use --clip"
            )
        if not 0 <= self.secagg_dropout < 1:
            raise ConfigError(f"secagg dropout must be in [0, 1), got {self.secagg_dropout!r}")
        if not 0 <= self.secagg_simulate_dropout < 1:
            raise ConfigError(
                f"simulated dropout must be in [0, 1), got {self.secagg_simulate_dropout!r}"
            )
        if not 1 <= self.secagg_scale_bits <= 40:
            raise ConfigError(
                f"secagg scale bits must be in [1, 40], got {self.secagg_scale_bits!r}"
            )
        if self.secure and not self.dp:
            raise ConfigError(
                "--secure draws DP noise from the OS; it needs --epsilon or --noise-multiplier"
            )
        if not 0 <= self.secagg_corrupt < 1:
            raise ConfigError(
                f"secagg corrupt fraction must be in [0, 1), got {self.secagg_corrupt!r}"
            )

    @property
    def dp(self) -> bool:
        """Whether differential privacy is on."""
        return self.epsilon is not None or self.noise_multiplier is not None

    @property
    def interaction_dp(self) -> bool:
        """Whether the clients run interaction-level DP-SGD (``--privacy-unit interaction``)."""
        return self.dp and self.privacy_unit == "interaction"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a run needs; written to ``config.toml`` fully resolved.

    ``rounds``/``cohort`` default per model: FedRAP trains every client every round,
    FedRecGEL a uniform 10% each round (as their papers do).
    """

    model: ModelName = "fedrap"
    dataset: str = "synthetic"
    data_dir: str | None = None
    rounds: int = DEFAULT_ROUNDS
    seed: int = 0
    client_fraction: float | None = None
    clients_per_round: int | None = None
    device: str = "cpu"
    eval_every: int = 1
    full_eval_every: int | None = None
    checkpoint_every: int = 10
    min_interactions: int | None = None
    synthetic_users: int = 943
    synthetic_items: int = 1682
    fedrap: FedRAPConfig = field(default_factory=FedRAPConfig)
    fedrecgel: FedRecGELConfig = field(default_factory=FedRecGELConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        for name in (
            "rounds",
            "eval_every",
            "checkpoint_every",
            "synthetic_users",
            "synthetic_items",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"{name.replace('_', ' ')} must be a positive integer, got {value!r}"
                )
        if self.full_eval_every is not None and (
            not isinstance(self.full_eval_every, int) or self.full_eval_every < 1
        ):
            raise ConfigError(
                f"full eval every must be a positive integer, got {self.full_eval_every!r}"
            )
        if self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.client_fraction is not None and self.clients_per_round is not None:
            raise ConfigError("give either --client-fraction or --clients-per-round, not both")
        if self.client_fraction is not None and not 0 < self.client_fraction <= 1:
            raise ConfigError(f"client fraction must be in (0, 1], got {self.client_fraction!r}")
        if self.clients_per_round is not None and self.clients_per_round < 1:
            raise ConfigError(
                f"clients per round must be a positive integer, got {self.clients_per_round!r}"
            )
        if self.min_interactions is not None and self.min_interactions < 3:
            raise ConfigError(
                "min interactions must be >= 3 (leave-one-out needs them), "
                f"got {self.min_interactions!r}"
            )
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be cpu or cuda, got {self.device!r}")

    def cohort(self, n_users: int) -> CohortSpec:
        """The cohort sampling of this run (flags first, else the model's paper default)."""
        if self.client_fraction is not None:
            if self.client_fraction == 1.0:
                return CohortSpec(kind="all")
            return CohortSpec(kind="poisson", fraction=self.client_fraction)
        if self.clients_per_round is not None:
            return CohortSpec(kind="fixed", size=self.clients_per_round)
        if self.model == "fedrecgel":
            return CohortSpec(kind="fixed", size=max(1, int(0.1 * n_users)))
        return CohortSpec(kind="all")

    def resolved_full_eval_every(self) -> int:
        """Full ranking every round for FedRAP (cheap); every 10 rounds for FedRecGEL, whose
        MLP scorer makes users x items scoring costly. The selected round is always given
        full-ranking metrics (from a saved copy of its model)."""
        if self.full_eval_every is not None:
            return self.full_eval_every
        return 10 if self.model == "fedrecgel" else 1

    def resolved_min_interactions(self) -> int:
        if self.min_interactions is not None:
            return self.min_interactions
        return 5 if self.model == "fedrecgel" else 3

    def to_dict(self) -> dict[str, Any]:
        """A TOML-ready mapping: scalars at the top, one table per sub-config."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = (
                dataclasses.asdict(value)
                if dataclasses.is_dataclass(value) and not isinstance(value, type)
                else value
            )
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TrainConfig:
        """Build a config from a mapping (e.g. a TOML file); unknown keys are errors."""
        subs = {"fedrap": FedRAPConfig, "fedrecgel": FedRecGELConfig, "privacy": PrivacyConfig}
        kwargs: dict[str, Any] = {}
        known = {f.name for f in dataclasses.fields(cls)}
        for key, value in raw.items():
            if key not in known:
                raise ConfigError(
                    f"unknown config key {key!r}; known keys: {', '.join(sorted(known))}"
                )
            if key in subs:
                if not isinstance(value, Mapping):
                    raise ConfigError(f"config section [{key}] must be a table")
                kwargs[key] = _build_sub(subs[key], key, value)
            else:
                kwargs[key] = value
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"invalid config: {exc}") from None


def _build_sub(kind: type, section: str, values: Mapping[str, Any]) -> Any:
    known = {f.name: f for f in dataclasses.fields(kind)}
    clean: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(
                f"unknown key {key!r} in [{section}]; known keys: {', '.join(sorted(known))}"
            )
        clean[key] = tuple(value) if isinstance(value, list) else value
    try:
        return kind(**clean)
    except TypeError as exc:
        raise ConfigError(f"invalid [{section}] config: {exc}") from None


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a mapping, with a clear error for a bad file."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None


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
    if config.model == "fedrap":
        return FedRAP(
            split,
            config.fedrap,
            generator=gen,
            device=config.device,
            dpsgd=dpsgd,
            noise_seed=config.seed,
        )
    return FedRecGEL(
        split,
        config.fedrecgel,
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
    return summary


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

    if split is None:
        split = load_split(config, download_progress=download_progress)
    if split.null_positives is not None and not config.privacy.interaction_dp:
        raise ConfigError(
            "the split holds null examples (interaction canaries), which only DP-SGD "
            "training (--privacy-unit interaction with --epsilon or --noise-multiplier) honours"
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
    if resume is not None and (run_dir / runs.CHECKPOINT_FILE).exists():
        ckpt = runs.load_checkpoint(run_dir)
        model.load_state_dict(ckpt["model"])
        aggregator.load_state_dict(ckpt.get("aggregator", {}))
        start_round = int(ckpt["round"])
        elapsed_before = float(ckpt.get("seconds", 0.0))
        metrics = runs.read_metrics(run_dir, upto_round=start_round)
        runs.rewrite_metrics(run_dir, metrics)
    elif resume is not None:
        runs.rewrite_metrics(run_dir, [])
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        runs.atomic_write_text(run_dir / runs.CONFIG_FILE, runs.dumps_toml(config.to_dict()))
        runs.write_json(run_dir / "data.json", _data_record(split.report, split))

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
        participants = sample_cohort(
            cohort, split.n_users, torch_generator(config.seed, "cohort", r)
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


def _complete_selected_round(
    config: TrainConfig, split: Split, metrics: list[dict[str, Any]], run_dir: Path
) -> None:
    """Give the selected round full-ranking metrics when it was evaluated sampled-only."""
    best = _selected_round(metrics)
    if best is None or "test_full_hr@10" in best:
        return
    saved = runs.load_state(run_dir / runs.BEST_FILE)
    if saved is None or saved["round"] != best["round"]:
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
