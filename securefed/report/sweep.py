"""Privacy-utility trade-off reports: run a grid of cells, audit them, write one page.

A *cell* is one training run: a model, a defense, a target epsilon and a seed. The grid is
the product of the requested models, defenses, epsilons and seeds, minus the combinations
that mean nothing (listed, with the reason, in the report)::

    defense     what it is                                              epsilon
    none        no DP, no secure aggregation                            inf only
    dp          user-level DP, central Gaussian noise on the sum       finite only
    secagg      secure aggregation without DP                           inf only
    dp+secagg   distributed discrete Gaussian noise inside secagg       finite only

A ``dp`` cell of a model with a private mode (``ModelSpec.private_mode``: FedRAP and
FedRecGEL) runs that mode unless ``ReportConfig.private_modes`` is off: the private popularity
prior, its rounds and Poisson cohorts (``--rounds`` still sets the rounds). Its ``dp+secagg``
cells cannot (the prior's release needs central noise) and run the model's uploads alone.

Every cell trains through :func:`securefed.train` into ``out/cells/<model>-<defense>-eps<e>-s
<seed>/`` and, unless disabled, is audited by :func:`attacks.audit.audit` (a seeded replay of
the run with canaries, into the cell's ``audit/`` folder), so the utility columns come from the
clean run and the attack columns from the audit. DP cells are replay runs
(``PrivacyConfig.replay``): their noise and cohorts are derived from the seed, which is what
makes a sweep reproducible and auditable, and what makes a report an experiment, not a way to
train a model for release.

Every row stands next to its yardsticks, from the same split and seed: the random and MostPop
baselines and, for a DP row, DP-MostPop at the row's epsilon (:mod:`securefed.baselines`; read
from the cell's ``summary.json``, or computed from the split for cells written before the
summaries carried them). Beside the grid, each seed also trains the CENTRALIZED references
(:attr:`ReportConfig.references`: iALS, and EASE when the catalogue is small enough to be
cheap) into ``out/cells/<model>-centralized-s<seed>/``: what a server that sees every
interaction reaches, labelled as such in every table and figure.

A sweep is resumable: a finished cell (its ``summary.json``, and ``audit/audit.json`` when
audits are on) is reused; a cell interrupted mid-training continues from its checkpoint; an
interrupted audit is redone. A cell keeps its checkpoint only while it trains: once its
``summary.json`` is written the checkpoint is deleted (nothing resumes a trained cell), and the
audit keeps neither its recording nor its replay's checkpoint, so a finished cell holds its
config, metrics, summary, ledger and ``audit/`` results only (docs/benchmarks.md, "Disk").

Then :func:`build_report` reads the cell directories (or any run / audit directories) into
``results.csv`` / ``results.parquet`` (one row per cell), draws the figures (PNG and SVG) and
writes ``report.html`` (self-contained) and ``report.md``.

Library code never prints: progress goes to the optional ``progress`` callback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from protocols.cores import usable_cores
from securefed import runs
from securefed.config import PrivacyConfig, TrainConfig, load_config_file
from securefed.errors import ConfigError, DataError, SecureFedError
from securefed.models.registry import PrivateMode, get_spec, model_names
from securefed.validation import check_field_types

__all__ = [
    "BASELINE_COLUMNS",
    "CENTRALIZED",
    "DEFENSES",
    "DP_BASELINE_COLUMNS",
    "REFERENCE_MAX_ITEMS",
    "REPORT_MARKERS",
    "REQUIRED_COLUMNS",
    "Cell",
    "ReportConfig",
    "ReportResult",
    "SkippedCell",
    "SweepEstimate",
    "SweepEvent",
    "build_report",
    "check_report_dependencies",
    "collect_results",
    "check_sweep_disk",
    "estimate_sweep",
    "plan_cells",
    "run_report",
]

DEFENSES: tuple[str, ...] = ("none", "dp", "secagg", "dp+secagg")
#: Appended to a row's ``defense`` when the run had a private popularity prior (a model's
#: private mode, ``ModelSpec.private_mode``): ``dp+prior``, ``dp+secagg+prior``.
PRIOR_SUFFIX = "+prior"
#: The ``defense`` of a centralized reference's row: no federation at all, the server sees
#: every interaction (not a defense a user can ask for).
CENTRALIZED = "centralized"
#: Report policy, not model knowledge: the largest catalogue for which a sweep trains a
#: reference whose cost grows with the items squared (EASE's items x items inverse is then a
#: few seconds and ~100 MB). A reference not named here is always trained.
REFERENCE_MAX_ITEMS: dict[str, int] = {"ease": 5000}
AUDIT_DIR = "audit"
CELLS_DIR = "cells"
SWEEP_FILE = "report.json"

_METRICS: tuple[str, ...] = ("test_hr@10", "test_ndcg@10", "test_full_hr@10", "test_full_ndcg@10")
#: The random and MostPop yardsticks of every row (same split and seed as the row).
BASELINE_COLUMNS: tuple[str, ...] = tuple(
    f"baseline_{name}_{m}" for name in ("random", "mostpop") for m in _METRICS
)
#: DP-MostPop at the row's epsilon: present (not NaN) on every DP row.
DP_BASELINE_COLUMNS: tuple[str, ...] = tuple(f"baseline_dp_mostpop_{m}" for m in _METRICS)

#: Columns that every row of ``results.csv`` has, with no missing value.
REQUIRED_COLUMNS: tuple[str, ...] = (
    "cell",
    "model",
    "role",
    "dataset",
    "defense",
    "epsilon",
    "seed",
    "rounds",
    "dp",
    "secagg",
    "epsilon_spent",
    "test_hr@10",
    "test_ndcg@10",
    "test_full_hr@10",
    "test_full_ndcg@10",
    "seconds",
    *BASELINE_COLUMNS,
)


def _eps_label(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


@dataclass(frozen=True, kw_only=True)
class ReportConfig:
    """The grid of a report and how to run it.

    Attributes:
        models: Models to compare: any registered model (``fedals``, ``fedrap``,
            ``fedrecgel``, ``mostpop``; a centralized one such as ``ials`` runs only without
            DP and secure aggregation).
        references: CENTRALIZED references trained once per seed beside the grid, on the same
            split (``ials``, ``ease``; EASE only when the catalogue has at most
            :data:`REFERENCE_MAX_ITEMS` items). Empty: none.
        dataset: Dataset name or path (as :class:`~securefed.TrainConfig` takes it).
        epsilons: Target user-level epsilons; ``math.inf`` means no DP.
        defenses: Any of :data:`DEFENSES`.
        seeds: Number of seeds per setting (seeds ``0 .. seeds-1``).
        rounds: Rounds per cell of the federated models (default: each model's own);
            MostPop (one count) and the centralized references keep their own.
        delta: DP delta of every private cell.
        jobs: Cells trained in parallel processes.
        audit: Audit every cell (a seeded replay with canaries; roughly doubles the cost).
        min_hr: Utility floor (test HR@10, sampled) of the summary; default 90 % of each
            model's no-DP HR@10.
        data_dir: Folder holding datasets.
        columns: The header's names for the roles of a table of your own
            (:attr:`securefed.TrainConfig.columns`).
        eval_negatives: Sampled evaluation negatives per held-out item (default 99;
            :attr:`securefed.TrainConfig.eval_negatives`).
        synthetic_users, synthetic_items: Size of the synthetic dataset.
        private_modes: ``dp`` cells of a model with a private mode run it
            (``ModelSpec.private_mode``); off: the model's uploads with DP and nothing else.
    """

    models: tuple[str, ...] = ("fedals", "fedrap", "fedrecgel")
    references: tuple[str, ...] = ("ials", "ease")
    dataset: str = "synthetic"
    epsilons: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
    defenses: tuple[str, ...] = DEFENSES
    seeds: int = 3
    rounds: int | None = None
    delta: float = 1e-5
    jobs: int = 1
    audit: bool = True
    min_hr: float | None = None
    data_dir: str | None = None
    columns: dict[str, str] | None = None
    eval_negatives: int | None = None
    synthetic_users: int | None = None
    synthetic_items: int | None = None
    private_modes: bool = True

    def __post_init__(self) -> None:
        # Types first: a string of epsilons was read a character at a time ("12": epsilons 1
        # and 2), a string model name ("got 'f'"); a string delta leaked Python's TypeError.
        check_field_types(self)
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "references", tuple(self.references))
        object.__setattr__(self, "defenses", tuple(self.defenses))
        object.__setattr__(self, "epsilons", tuple(float(e) for e in self.epsilons))
        if not self.models:
            raise ConfigError("models must name at least one model")
        for m in self.models:
            if m not in model_names():
                raise ConfigError(f"model must be one of {', '.join(model_names())}, got {m!r}")
        if len(set(self.models)) != len(self.models):
            raise ConfigError(f"models must not repeat, got {','.join(self.models)}")
        centralized = model_names("centralized")
        for m in self.references:
            if m not in centralized:
                raise ConfigError(
                    f"references must be centralized models ({', '.join(centralized)}), got {m!r}"
                )
        if len(set(self.references)) != len(self.references):
            raise ConfigError(f"references must not repeat, got {','.join(self.references)}")
        if not self.defenses:
            raise ConfigError("defenses must name at least one defense")
        for d in self.defenses:
            if d not in DEFENSES:
                raise ConfigError(f"defense must be one of {', '.join(DEFENSES)}, got {d!r}")
        if len(set(self.defenses)) != len(self.defenses):
            raise ConfigError(f"defenses must not repeat, got {','.join(self.defenses)}")
        if not self.epsilons:
            raise ConfigError("epsilons must hold at least one value (inf = no DP)")
        for e in self.epsilons:
            if math.isnan(e) or e <= 0:
                raise ConfigError(f"epsilon must be > 0 or inf, got {e!r}")
        if len(set(self.epsilons)) != len(self.epsilons):
            raise ConfigError("epsilons must not repeat")
        for name in ("seeds", "jobs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.rounds is not None and (
            isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1
        ):
            raise ConfigError(f"rounds must be a positive integer, got {self.rounds!r}")
        if self.min_hr is not None and not 0 <= self.min_hr <= 1:
            raise ConfigError(f"min HR must be in [0, 1], got {self.min_hr!r}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"delta must be in (0, 1), got {self.delta!r}")
        for name in ("audit", "private_modes"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        # Build one training config per model now, so a bad dataset size fails before any run.
        for model in (*self.models, *self.references):
            self._base(model, 0)

    def _base(self, model: str, seed: int) -> dict[str, Any]:
        raw: dict[str, Any] = {"model": model, "dataset": self.dataset, "seed": seed}
        if self.rounds is not None and get_spec(model).role == "federated":
            raw["rounds"] = self.rounds
        if self.data_dir is not None:
            raw["data_dir"] = self.data_dir
        if self.columns is not None:
            raw["columns"] = dict(self.columns)
        if self.eval_negatives is not None:
            raw["eval_negatives"] = self.eval_negatives
        if self.synthetic_users is not None:
            raw["synthetic_users"] = self.synthetic_users
        if self.synthetic_items is not None:
            raw["synthetic_items"] = self.synthetic_items
        TrainConfig.from_dict(raw)
        return raw

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain values (lists, numbers, strings; what ``report.json``
        records and :meth:`from_dict` reads back)."""
        return {
            "models": list(self.models),
            "references": list(self.references),
            "dataset": self.dataset,
            "epsilons": [_eps_label(e) for e in self.epsilons],
            "defenses": list(self.defenses),
            "seeds": self.seeds,
            "rounds": self.rounds,
            "delta": self.delta,
            "jobs": self.jobs,
            "audit": self.audit,
            "min_hr": self.min_hr,
            "data_dir": self.data_dir,
            "columns": self.columns,
            "eval_negatives": self.eval_negatives,
            "synthetic_users": self.synthetic_users,
            "synthetic_items": self.synthetic_items,
            "private_modes": self.private_modes,
        }


@dataclass(frozen=True)
class Cell:
    """One point of the grid: a model, a defense, a target epsilon and a seed.

    A centralized model's only cell has the defense :data:`CENTRALIZED` (no federation, no
    DP) and is never audited: there are no uploads to attack.
    """

    model: str
    defense: str
    epsilon: float
    seed: int

    @property
    def name(self) -> str:
        """The cell's folder under ``cells/`` (``fedals-dp-eps2-s0``, ``ials-centralized-s0``)."""
        if self.defense == CENTRALIZED:
            return f"{self.model}-{CENTRALIZED}-s{self.seed}"
        return f"{self.model}-{self.defense}-eps{_eps_label(self.epsilon)}-s{self.seed}"

    @property
    def audited(self) -> bool:
        """Whether the sweep audits this cell (when audits are on)."""
        return self.defense != CENTRALIZED

    def train_config(self, config: ReportConfig) -> TrainConfig:
        """The cell's training config: the report's base settings plus its defense."""
        raw = config._base(self.model, self.seed)
        dp = self.defense in ("dp", "dp+secagg")
        secagg = self.defense in ("secagg", "dp+secagg")
        mode = self.private_mode(config)
        extra: dict[str, Any] = {}
        if mode is not None:
            fields, extra = mode.config_fields()
            raw = {**fields, **raw}  # the report's --rounds, when given, wins
        privacy = PrivacyConfig(
            epsilon=self.epsilon if dp else None,
            delta=config.delta,
            noise=("distributed" if secagg else "central") if dp else None,
            secagg=secagg,
            # A report is an experiment: its DP cells replay their noise and cohorts from the
            # seed, so a sweep resumes to the same numbers and the audit re-simulates the cell.
            replay=dp,
            **extra,
        )
        return TrainConfig.from_dict({**raw, "privacy": _privacy_dict(privacy)})

    def private_mode(self, config: ReportConfig) -> PrivateMode | None:
        """The model's private mode when this cell runs it (a ``dp`` cell, the report's
        ``private_modes`` on), else None."""
        if self.defense != "dp" or not config.private_modes:
            return None
        return get_spec(self.model).private_mode


def _privacy_dict(p: PrivacyConfig) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(p).items() if v is not None}


@dataclass(frozen=True)
class SkippedCell:
    """A requested combination that means nothing, and why it was not run."""

    model: str
    defense: str
    epsilon: float
    reason: str


def plan_cells(config: ReportConfig) -> tuple[list[Cell], list[SkippedCell]]:
    """The cells to run (model, epsilon, defense, seed order) and the skipped combinations.

    A centralized model (named in ``models`` or in ``references``) has one cell per seed with
    the defense :data:`CENTRALIZED`; the defenses it cannot have are listed as skipped when it
    was named in ``models``. References come last.
    """
    cells: list[Cell] = []
    skipped: list[SkippedCell] = []
    epsilons = sorted(config.epsilons)
    for model in config.models:
        if not get_spec(model).federated:
            why = (
                f"{model} is a CENTRALIZED reference (the server sees every interaction): "
                "there is no federated protocol to add DP or secure aggregation to; its one "
                f"setting is the {CENTRALIZED} row"
            )
            skipped.extend(SkippedCell(model, d, e, why) for e in epsilons for d in config.defenses)
            cells.extend(Cell(model, CENTRALIZED, math.inf, s) for s in range(config.seeds))
            continue
        for eps in epsilons:
            for defense in config.defenses:
                dp = defense in ("dp", "dp+secagg")
                if dp and math.isinf(eps):
                    why = (
                        f"{defense} at epsilon inf is not private; "
                        + ("the none cell" if defense == "dp" else "the secagg cell")
                        + " covers it"
                    )
                    skipped.append(SkippedCell(model, defense, eps, why))
                    continue
                if not dp and not math.isinf(eps):
                    why = f"{defense} adds no DP noise, so epsilon {eps:g} does not apply"
                    skipped.append(SkippedCell(model, defense, eps, why))
                    continue
                cells.extend(Cell(model, defense, eps, s) for s in range(config.seeds))
    for model in config.references:
        if model not in config.models:
            cells.extend(Cell(model, CENTRALIZED, math.inf, s) for s in range(config.seeds))
    return cells, skipped


@dataclass(frozen=True)
class SweepEvent:
    """A progress notice of :func:`run_report`.

    ``kind`` is ``"plan"`` (once: ``total`` cells, ``done`` of them already finished),
    ``"start"`` (a cell begins; ``stage`` is ``train`` or ``audit``; with ``jobs > 1`` one per
    cell as it is handed to a free worker, ``stage`` ``train``), ``"round"`` (a training or
    audit round finished; only when ``jobs == 1``), or ``"done"`` (a cell finished;
    ``seconds`` its own run time). Cells reused from an earlier sweep are counted in the
    plan's ``done`` and get no event of their own. The ``"plan"`` event carries
    the :class:`SweepEstimate` of the cells left to run.
    """

    kind: Literal["plan", "start", "round", "done"]
    done: int
    total: int
    cell: str | None = None
    stage: str | None = None
    round: int | None = None
    rounds: int | None = None
    seconds: float = 0.0
    estimate: SweepEstimate | None = None


ProgressFn = Callable[[SweepEvent], None]


#: A report's pages beside its cells (``results.csv`` and ``.parquet``, ``report.md`` and
#: ``.html``, the figures as PNG and SVG, the html embedding the PNGs): a bound of 8 MB plus
#: 16 kB a row. Measured: docs/report-ml100k's five figures are 0.71 MB as PNG (34 cells,
#: audited); an 8-cell synthetic report without audits wrote 0.40 MB of pages (2026-12-08).
REPORT_PAGES_BYTES = 8_000_000
REPORT_ROW_BYTES = 16 * 1024


@dataclass(frozen=True)
class SweepEstimate:
    """The estimated cost of the cells a sweep still has to run (:mod:`securefed.costs`).

    Attributes:
        cells: Cell name -> estimated seconds (training, plus the audit when it runs).
        seconds: All of them, divided among ``jobs`` parallel processes.
        disk_bytes: What the cells' directories keep once they have finished (metrics,
            summaries, ledgers and, for audited cells, the audit's scores and its replay's
            metrics: :func:`attacks.audit.estimate_audit_disk`; checkpoints, released models
            and recordings are deleted as each cell finishes) and the report's pages.
        disk_peak: The most disk the sweep needs at once: what the cells keep plus, per job,
            the most one running cell holds beyond (its checkpoints, two while one replaces
            the other; then its audit's replay checkpoints, recording and scores).
        peak_memory: The largest cell's estimated peak, times the parallel jobs.
        speed: The machine probe's factor the times were scaled by.
        jobs: Cells run in parallel.
        running_disk: The most one running cell holds while it trains and is audited.
        disk_peak_unaudited: ``disk_peak`` of the same cells without their audits.
    """

    cells: dict[str, float]
    seconds: float
    disk_bytes: int
    peak_memory: int
    speed: float
    jobs: int = 1
    disk_peak: int = 0
    running_disk: int = 0
    disk_peak_unaudited: int = 0

    def disk_peak_with(self, jobs: int) -> int:
        """``disk_peak`` had the sweep run ``jobs`` cells at a time: what the cells keep, then
        beside it the running cells or, once they have all finished, the report's pages."""
        pages = _pages_bytes(len(self.cells))
        return self.disk_bytes - pages + max(self.running_disk * jobs, pages)

    def line(self) -> str:
        """One line: cells, time, disk, memory."""
        from securefed.costs import format_bytes, format_seconds

        n = len(self.cells)
        return (
            f"estimate: {n} cell{'s' if n != 1 else ''} to run, about "
            f"{format_seconds(self.seconds)}, {format_bytes(self.disk_bytes)} of disk kept "
            f"({format_bytes(max(self.disk_peak, self.disk_bytes))} at most while cells run), peak "
            f"memory {format_bytes(self.peak_memory)} (rough: machine probe x{self.speed:.1f}; "
            "the time left is re-estimated as cells finish)"
        )


def estimate_sweep(
    config: ReportConfig,
    todo: Sequence[tuple[str, TrainConfig, bool]],
    *,
    speed: float | None = None,
    check: bool = True,
) -> SweepEstimate:
    """Estimate the cells ``todo`` (name, training config, audited) of a sweep.

    Loads the dataset once for its shape. With ``check``, a sweep whose largest cell (times
    the parallel jobs) cannot fit in the available memory is refused before any cell runs
    (the disk: :func:`check_sweep_disk`).

    Raises:
        InsufficientMemory: One line: the estimate, what is available and what would fit.
    """
    from securefed.costs import (
        RunShape,
        check_memory,
        estimate_run,
        machine_speed,
        run_files_bytes,
    )
    from securefed.training import load_split

    cells: dict[str, float] = {}
    disk = plain_disk = 0
    running = plain_running = 0
    peak = 0
    if not todo:
        return SweepEstimate(cells, 0.0, 0, 0, 1.0)
    speed = machine_speed() if speed is None else speed
    shape = RunShape.of(load_split(todo[0][1]))
    worst = None
    for name, cfg, audited in todo:
        est = estimate_run(cfg, shape, speed=speed)
        cells[name] = est.seconds
        # Kept: metrics, summary and ledger (the report deletes model.pt and every checkpoint)
        # and the audit's scores and replay metrics. Running: the cell's checkpoints while it
        # trains, then its audit's replay (the same model with the canary clients added), its
        # recording and scores, beside what the cell keeps; one cell per job at a time.
        kept = (
            est.disk_final
            - est.model_bytes
            - (est.checkpoint_bytes if cfg.keep_private_state else 0)
            + run_files_bytes(cfg)
        )
        cell_running = est.disk_peak + run_files_bytes(cfg)
        plain_disk += kept
        plain_running = max(plain_running, cell_running)
        if audited:
            from attacks.audit import (
                audit_canaries,
                estimate_audit_disk,
                estimate_audit_seconds,
                prepare_audit_config,
            )

            # The audit replays the cell as the audit prepares it: private fedals puts the
            # canaries' items in its co-occurrence set (uploads 4x as wide on MovieLens 100K).
            n_canaries = audit_canaries(cfg, shape.users)  # a report's audits plant the default
            if check and not cfg.privacy.interaction_dp:
                # Before any cell trains: every audit failed after its cell on a catalogue
                # too small for canary clients (found by a library walkthrough).
                from attacks.canaries import check_canary_room

                check_canary_room(shape.items, cfg.eval_negatives)
            audit_cfg = prepare_audit_config(cfg, n_canaries)
            cells[name] += estimate_audit_seconds(
                audit_cfg,
                shape.users,
                shape.items,
                est.seconds,
                full_eval_seconds=est.full_eval_seconds,
                speed=speed,
                canaries=n_canaries,
            )
            audit = estimate_audit_disk(audit_cfg, shape, canaries=n_canaries)
            cell_running = max(cell_running, kept + audit.peak)
            kept += audit.kept
        disk += kept
        running = max(running, cell_running)
        if worst is None or est.peak_memory > worst[1].peak_memory:
            worst = (cfg, est)
        peak = max(peak, est.peak_memory)
    jobs = min(config.jobs, len(todo))
    if check and worst is not None:
        cfg, est = worst
        check_memory(cfg, dataclasses.replace(est, peak_memory=est.peak_memory * jobs))
    pages = _pages_bytes(len(todo))
    return SweepEstimate(
        cells=cells,
        seconds=sum(cells.values()) / jobs,
        disk_bytes=disk + pages,
        peak_memory=peak * jobs,
        speed=speed,
        jobs=jobs,
        disk_peak=disk + max(running * jobs, pages),
        running_disk=running,
        disk_peak_unaudited=plain_disk + max(plain_running * jobs, pages),
    )


def _pages_bytes(cells: int) -> int:
    """The report's pages for ``cells`` rows (:data:`REPORT_PAGES_BYTES`)."""
    return REPORT_PAGES_BYTES + REPORT_ROW_BYTES * cells


def check_sweep_disk(
    estimate: SweepEstimate,
    out: str | Path,
    *,
    audited: bool,
    replaced: int = 0,
    free: int | None = None,
) -> None:
    """Refuse a sweep whose disk at its largest (``estimate.disk_peak``) exceeds the free
    space of the file system ``out`` goes on, before any cell runs or anything is written.

    Args:
        estimate: The cells to run (:func:`estimate_sweep`).
        out: The report directory (need not exist).
        audited: The cells are audited (``--no-audit`` would save their audits' disk).
        replaced: Bytes the cells to run already hold under ``out`` (an interrupted cell's
            checkpoint is replaced, its unfinished audit removed): counted as free.
        free: Free bytes there (default: read; unknown: no check).

    Raises:
        InsufficientDisk: one line with what the sweep needs, what is free where, and what
            would fit: ``--jobs 1``, ``--no-audit``, or space.
    """
    from securefed.costs import InsufficientDisk, format_bytes, free_disk_at

    where, read = free_disk_at(out)
    if free is None:
        free = read
    if free is None or not estimate.cells:
        return
    free += replaced
    if estimate.disk_peak <= free:
        return
    kept = estimate.disk_bytes
    if estimate.jobs > 1 and estimate.disk_peak_with(1) <= free:
        hint = "--jobs 1 would fit"
    elif audited and estimate.disk_peak_unaudited <= free:
        hint = "--no-audit would fit (audit a subset of the grid later into the same --out)"
    else:
        hint = "free space on that file system, or choose an --out on one with more free space"
    n = len(estimate.cells)
    jobs = f" x {estimate.jobs} jobs" if estimate.jobs > 1 else ""
    raise InsufficientDisk(
        f"this report needs about {format_bytes(estimate.disk_peak)} of disk at its largest "
        f"({n} cell{'s' if n != 1 else ''} to run: {format_bytes(kept)} kept once they finish, "
        f"with the report's pages; up to {format_bytes(estimate.running_disk)} for a running "
        f"cell{jobs} while it trains{' and is audited' if audited else ''}) but "
        f"{format_bytes(free)} is free on the file system holding {where}; {hint}"
    )


@dataclass(frozen=True)
class ReportResult:
    """What :func:`run_report` / :func:`build_report` return: where things are, and the table."""

    out: Path
    html: Path
    markdown: Path
    csv: Path
    parquet: Path
    figures: dict[str, Path]
    results: Any  # pandas.DataFrame, one row per cell
    skipped: list[SkippedCell] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- running cells


def _audit_available() -> str | None:
    """None when :func:`attacks.audit.audit` can run here, else why it cannot."""
    try:
        import attacks.audit  # noqa: F401
        import attacks.report  # noqa: F401
    except ImportError as exc:
        return f"the audit module could not be imported ({exc})"
    return None


AUDIT_FAILED = "failed.json"


def _cell_finished(cell_dir: Path, audit: bool) -> bool:
    if not (cell_dir / runs.SUMMARY_FILE).exists():
        return False
    done = cell_dir / AUDIT_DIR
    return not audit or (done / "audit.json").exists() or (done / AUDIT_FAILED).exists()


#: What marks a folder as an earlier report's, which a rerun continues or rewrites: what a
#: report writes and a person would not (a sweep's ``cells/`` and ``report.json``, written
#: first; ``recommendations.json``, which ``--from`` writes beside its pages). Not
#: ``report.md``: a folder holding only a hand-written one was taken for a report and the
#: file overwritten (found in a walkthrough).
REPORT_MARKERS: tuple[str, ...] = (CELLS_DIR, SWEEP_FILE, "recommendations.json")


def _refuse_foreign_out(out: Path) -> None:
    """A report writes a folder of its own: ``out`` must be new, empty, or a report's
    (:data:`REPORT_MARKERS`; ``report.json`` comes first, so an interrupted start leaves it
    alone). It used to write its cells and pages beside whatever the folder held, a finished
    run's ``model.pt`` included (found 2026-12-06)."""
    from securefed.training import refuse_foreign_files

    refuse_foreign_files(out, kind="report directory", continues=REPORT_MARKERS)


def _same_config(cell_dir: Path, expected: TrainConfig) -> bool:
    """Whether the cell directory ran ``expected`` (or holds no config yet)."""
    try:
        _check_cell_config(cell_dir, expected)
    except ConfigError:
        return False
    return True


def _check_cell_config(cell_dir: Path, expected: TrainConfig) -> None:
    path = cell_dir / runs.CONFIG_FILE
    if not path.exists():
        return
    found = TrainConfig.from_dict(load_config_file(path)).to_dict()
    want = expected.to_dict()
    resolve = expected.spec.resolve_for_data
    if found != want and resolve is not None:
        # config.toml records what the model settled on the data (the private fedals' mode,
        # the population rule); compare with what this grid's config settles to.
        from securefed.training import load_split

        want = resolve(expected, load_split(expected))[0].to_dict()
    if found != want:
        diff = sorted(k for k in want if found.get(k) != want.get(k))
        raise ConfigError(
            f"{cell_dir} was run with other settings ({', '.join(diff)} differ); "
            "choose another --out for this grid, or remove that cell directory"
        )


def _run_cell(
    cell_dir: Path,
    train_cfg: TrainConfig,
    *,
    audit: bool,
    on_round: Callable[[str, int, int], None] | None = None,
) -> None:
    """Train (or continue) one cell and audit it; safe to call again after an interruption."""
    from securefed.training import train

    def rounds_cb(stage: str) -> Any:
        if on_round is None:
            return None
        return lambda rec: on_round(stage, rec.round, train_cfg.rounds)

    if not (cell_dir / runs.SUMMARY_FILE).exists():
        if (cell_dir / runs.CONFIG_FILE).exists():
            train(resume=cell_dir, progress=rounds_cb("train"))
        else:
            train(train_cfg, out=cell_dir, progress=rounds_cb("train"))
    _drop_checkpoints(cell_dir)
    if audit and not _cell_finished(cell_dir, audit):
        from attacks.audit import AuditConfig, ResumedRun
        from attacks.audit import audit as run_audit

        audit_dir = cell_dir / AUDIT_DIR
        if audit_dir.exists():  # an audit interrupted mid-way: redo it from scratch
            shutil.rmtree(audit_dir)
        try:
            try:
                run_audit(
                    AuditConfig(run=str(cell_dir)), out=audit_dir, progress=rounds_cb("audit")
                )
            except ResumedRun:
                # An interrupted cell resumed and released a round again: no re-simulation
                # is that run, so the audit trains its own replay of the cell's config (what
                # it re-simulated before audit --run refused such runs, 2026-12-07).
                recorded = TrainConfig.from_dict(load_config_file(cell_dir / runs.CONFIG_FILE))
                run_audit(AuditConfig(train=recorded), out=audit_dir, progress=rounds_cb("audit"))
        except SecureFedError as exc:
            # The utility run stands on its own; the report names the cell and the reason.
            runs.write_json(audit_dir / AUDIT_FAILED, {"error": str(exc)})
        _drop_checkpoints(cell_dir)  # and the audit replay's


def _drop_checkpoints(cell_dir: Path) -> None:
    """Delete a trained cell's model files: its checkpoint serves only to resume training,
    which a cell with a ``summary.json`` never does again, and the report reads the metrics,
    the summary and the audit, not the released model; so does a private prior's file
    (:data:`securefed.prior.PRIOR_FILE`: the released counts, kept so that a resumed run never
    releases them twice; the audit reads its own replay's). Also those of the audit's replay
    once it has finished, and of an audit written before audits dropped theirs."""
    from securefed.prior import PRIOR_FILE

    if not (cell_dir / runs.SUMMARY_FILE).exists():
        return
    audited = _cell_finished(cell_dir, True)
    for run_dir in (cell_dir, cell_dir / AUDIT_DIR / "replay", cell_dir / AUDIT_DIR / "run"):
        if run_dir != cell_dir and not audited:
            continue  # an audit not finished yet reads its replay's prior (or is redone)
        for name in (runs.CHECKPOINT_FILE, runs.BEST_FILE, runs.MODEL_FILE, PRIOR_FILE):
            (run_dir / name).unlink(missing_ok=True)


def _cell_job(cell_dir: str, config: dict[str, Any], audit: bool, threads: int) -> float:
    """Entry point of a worker process (top level, so it pickles under spawn); returns the
    seconds the cell took in it (not counting its wait in the pool's queue)."""
    import torch

    t0 = time.perf_counter()
    torch.set_num_threads(threads)
    _run_cell(Path(cell_dir), TrainConfig.from_dict(config), audit=audit)
    return time.perf_counter() - t0


def _pending(
    config: ReportConfig, cells: Sequence[Cell], out: Path, audit: bool
) -> list[tuple[Cell, Path, TrainConfig]]:
    """The cells a sweep still has to run (reads only): every cell directory's config is
    checked against the grid first, so a conflict is refused before anything runs.

    Raises:
        ConfigError: A cell directory in ``out`` was run with other settings.
    """
    todo: list[tuple[Cell, Path, TrainConfig]] = []
    for cell in cells:
        cell_dir = out / CELLS_DIR / cell.name
        cfg = cell.train_config(config)
        try:
            _check_cell_config(cell_dir, cfg)  # every conflict is reported before any run
        except ConfigError:
            other = dataclasses.replace(config, private_modes=not config.private_modes)
            if get_spec(cell.model).private_mode is None or cell.defense != "dp":
                raise
            if not _same_config(cell_dir, cell.train_config(other)):
                raise
            flag = "--private-modes" if other.private_modes else "--no-private-modes"
            ran = "its private mode" if other.private_modes else "DP on its uploads alone"
            raise ConfigError(
                f"{cell_dir} ran {cell.model} with {ran}; give {flag} to continue that grid, "
                "or choose another --out for this one"
            ) from None
        if not _cell_finished(cell_dir, audit and cell.audited):
            todo.append((cell, cell_dir, cfg))
    return todo


def _held_bytes(directories: Iterable[Path]) -> int:
    """Bytes of the files under ``directories`` (those that exist)."""
    return sum(
        p.stat().st_size for d in directories if d.is_dir() for p in d.rglob("*") if p.is_file()
    )


def _sweep(
    config: ReportConfig,
    cells: Sequence[Cell],
    todo: Sequence[tuple[Cell, Path, TrainConfig]],
    out: Path,
    audit: bool,
    progress: ProgressFn | None,
    estimate: SweepEstimate,
) -> None:
    emit = progress or (lambda _e: None)
    pending = {cell.name for cell, _, _ in todo}
    for cell in cells:
        if cell.name not in pending:
            _drop_checkpoints(out / CELLS_DIR / cell.name)  # an earlier version's sweep's
    total = len(cells)
    done = total - len(todo)
    emit(SweepEvent("plan", done, total, estimate=estimate))
    if config.jobs == 1 or len(todo) <= 1:
        for cell, cell_dir, cfg in todo:
            emit(SweepEvent("start", done, total, cell.name, stage="train"))
            t0 = time.perf_counter()

            def on_round(
                stage: str, r: int, n: int, name: str = cell.name, finished: int = done
            ) -> None:
                emit(SweepEvent("round", finished, total, name, stage=stage, round=r, rounds=n))

            _run_cell(cell_dir, cfg, audit=audit and cell.audited, on_round=on_round)
            done += 1
            emit(SweepEvent("done", done, total, cell.name, seconds=time.perf_counter() - t0))
        return
    import multiprocessing

    threads = max(1, usable_cores() // config.jobs)
    ctx = multiprocessing.get_context("spawn")
    queue = list(todo)
    with ProcessPoolExecutor(max_workers=config.jobs, mp_context=ctx) as pool:
        running: dict[Future[float], Cell] = {}

        def start_next() -> None:
            # At most `jobs` cells are submitted at a time, so a submitted cell has a free
            # worker: its start event is when it starts.
            cell, cell_dir, cfg = queue.pop(0)
            fut = pool.submit(
                _cell_job, str(cell_dir), cfg.to_dict(), audit and cell.audited, threads
            )
            running[fut] = cell
            emit(SweepEvent("start", done, total, cell.name, stage="train"))

        try:
            for _ in range(min(config.jobs, len(queue))):
                start_next()
            while running:
                finished, _ = wait(set(running), return_when=FIRST_COMPLETED)
                for fut in finished:
                    # A failed cell stops the sweep with its own error; its seconds are the
                    # worker's own.
                    cell = running.pop(fut)
                    seconds = fut.result()
                    done += 1
                    emit(SweepEvent("done", done, total, cell.name, seconds=seconds))
                    if queue:
                        start_next()
        except BaseException:
            for fut in running:
                fut.cancel()
            raise


#: The packages a report writes its outputs with (results.parquet, the figures).
REPORT_PACKAGES = {"pyarrow": "results.parquet", "matplotlib": "the figures"}


def check_report_dependencies() -> None:
    """Refuse a report whose outputs could not be written, before any work starts.

    Both are dependencies of securefed since the report is one of its main outputs; this
    catches an environment that removed them (or installed with ``--no-deps``).

    Raises:
        ConfigError: one line naming what is missing and the command that installs it.
    """
    import importlib.util

    missing = [name for name in REPORT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        what = ", ".join(f"{m} (for {REPORT_PACKAGES[m]})" for m in missing)
        raise ConfigError(
            f"a report needs {what}, which this environment lacks; pip install "
            f"{' '.join(missing)} (or pip install -e . again), then rerun"
        )


def run_report(
    config: ReportConfig, *, out: str | Path, progress: ProgressFn | None = None
) -> ReportResult:
    """Run (or continue) the grid of ``config`` into ``out`` and build its report.

    Args:
        config: The grid.
        out: Report directory; cells go to ``out/cells/``. Rerunning with the same grid reuses
            finished cells and continues interrupted ones.
        progress: Called with a :class:`SweepEvent` as the sweep advances.

    Returns:
        Where the report files are, and the results table.

    Raises:
        ConfigError: A cell directory in ``out`` was run with other settings.
        InsufficientMemory: The largest cell (times ``jobs``) cannot fit in the available
            memory (:func:`estimate_sweep`); nothing was trained or written.
        InsufficientDisk: The cells to run, their audits and the report's pages cannot fit
            in the free space where ``out`` goes (:func:`check_sweep_disk`); nothing was
            trained or written.
        DataError: The dataset is missing or malformed.
    """
    from securefed.training import check_run_dir_writable

    check_report_dependencies()  # before the first cell trains, not after the last
    out = Path(out)
    check_run_dir_writable(out, kind="report directory")
    _refuse_foreign_out(out)
    from securefed.costs import check_synthetic_fits

    speed = None  # one machine probe for all models
    for model in config.models:  # a synthetic dataset too big is refused before it exists
        speed = check_synthetic_fits(TrainConfig.from_dict(config._base(model, 0)), speed=speed)
    notes: list[str] = []
    config = _cheap_references(config, notes)
    cells, skipped = plan_cells(config)
    audit = config.audit
    if audit:
        why = _audit_available()
        if why is not None:
            audit = False
            notes.append(f"No attack audit was run: {why}.")
    else:
        notes.append(
            "This sweep ran no attack audit (--no-audit); audits written by earlier sweeps "
            "into the same cells are kept."
        )
    if not cells:
        reasons = sorted({s.reason for s in skipped})
        raise ConfigError(
            "the grid has no cell to run"
            + (f" ({'; '.join(reasons)})" if reasons else "")
            + "; change --models, --defenses or --epsilons"
        )
    # Before anything is written: conflicting cells, then memory and disk.
    todo = _pending(config, cells, out, audit)
    estimate = estimate_sweep(
        config, [(cell.name, cfg, audit and cell.audited) for cell, _, cfg in todo]
    )
    check_sweep_disk(
        estimate,
        out,
        audited=audit and any(cell.audited for cell, _, _ in todo),
        replaced=_held_bytes(cell_dir for _, cell_dir, _ in todo),
    )
    fresh_dir, fresh_file = not out.exists(), not (out / SWEEP_FILE).exists()
    out.mkdir(parents=True, exist_ok=True)
    runs.write_json(
        out / SWEEP_FILE,
        {
            "config": config.to_dict(),
            "cells": [c.name for c in cells],
            "skipped": [_skip_dict(s) for s in skipped],
            "notes": notes,
        },
    )
    try:
        _sweep(config, cells, todo, out, audit, progress, estimate)
    except (ConfigError, DataError):
        # Refused before any cell finished (bad data, too big for memory): leave nothing
        # this call wrote behind; a sweep that finished cells keeps them to continue.
        if not any((out / CELLS_DIR / c.name / runs.SUMMARY_FILE).exists() for c in cells):
            if fresh_dir:
                shutil.rmtree(out, ignore_errors=True)
            elif fresh_file:
                (out / SWEEP_FILE).unlink(missing_ok=True)
        raise
    return _build(
        [out / CELLS_DIR / c.name for c in cells],
        out,
        skipped=skipped,
        notes=notes,
        min_hr=config.min_hr,
    )


def _cheap_references(config: ReportConfig, notes: list[str]) -> ReportConfig:
    """``config`` without the references whose catalogue limit the dataset exceeds."""
    limited = [r for r in config.references if r in REFERENCE_MAX_ITEMS]
    if not limited:
        return config
    from securefed.training import load_split

    n_items = load_split(TrainConfig.from_dict(config._base(limited[0], 0))).n_items
    dropped = [r for r in limited if n_items > REFERENCE_MAX_ITEMS[r]]
    for r in dropped:
        notes.append(
            f"The {r} reference was left out: the report trains it up to "
            f"{REFERENCE_MAX_ITEMS[r]} items and this dataset has {n_items} (its cost grows "
            f"with the items squared); train it with securefed train --model {r} if wanted."
        )
    kept = tuple(r for r in config.references if r not in dropped)
    return dataclasses.replace(config, references=kept) if dropped else config


def _skip_dict(s: SkippedCell) -> dict[str, Any]:
    return {
        "model": s.model,
        "defense": s.defense,
        "epsilon": _eps_label(s.epsilon),
        "reason": s.reason,
    }


# ---------------------------------------------------------------------------- reading results


def _find_runs(path: Path) -> list[tuple[Path, Path | None]]:
    """(run directory, audit.json or None) pairs found under one ``--from`` path."""
    if (path / CELLS_DIR).is_dir():
        found: list[tuple[Path, Path | None]] = []
        for child in sorted((path / CELLS_DIR).iterdir()):
            if (child / runs.SUMMARY_FILE).exists():
                found.extend(_find_runs(child))
        return found
    if (path / runs.SUMMARY_FILE).exists():
        audit = path / AUDIT_DIR / "audit.json"
        failed = path / AUDIT_DIR / AUDIT_FAILED
        return [(path, audit if audit.exists() else failed if failed.exists() else None)]
    if (path / "audit.json").exists():  # an audit directory: it trained or replayed the run
        for sub in ("run", "replay"):
            if (path / sub / runs.SUMMARY_FILE).exists():
                return [(path / sub, path / "audit.json")]
        raise DataError(f"{path} holds audit.json but no run/ or replay/ run directory")
    if path.is_dir():
        raise DataError(
            f"{path} is not a run, audit or report directory (no {runs.SUMMARY_FILE}, "
            "audit.json or cells/); pass directories written by train, audit or report"
        )
    raise DataError(f"{path} does not exist; pass existing run, audit or report directories")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None


def _f(value: Any) -> float:
    """A float, with None (absent) as NaN."""
    if value is None:
        return math.nan
    if isinstance(value, list):  # several noise multipliers in one run: report the smallest
        return float(min(value)) if value else math.nan
    return float(value)


class _Baselines:
    """Baselines of runs whose ``summary.json`` predates them, computed from the split.

    One split per (dataset, seed, filter) and one DP-MostPop per (split, epsilon, delta,
    unit), so a grid of old cells costs a few seconds. A split that cannot be rebuilt (the
    data moved) leaves the row's baseline columns empty and says so in ``notes``.
    """

    def __init__(self) -> None:
        self._splits: dict[tuple[Any, ...], Any] = {}
        self._values: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.notes: list[str] = []

    def for_run(self, cfg: TrainConfig, epsilon: float | None, users: Any) -> dict[str, Any]:
        from securefed.baselines import baseline_metrics
        from securefed.training import load_split

        key = (
            cfg.dataset,
            cfg.data_dir,
            tuple((cfg.columns or {}).items()),
            cfg.eval_negatives,
            cfg.seed,
            cfg.min_interactions,
            cfg.synthetic_users,
            cfg.synthetic_items,
        )
        if key not in self._splits:
            try:
                self._splits[key] = load_split(cfg)
            except SecureFedError as exc:
                self._splits[key] = None
                self.notes.append(
                    f"Baselines of {cfg.dataset} seed {cfg.seed} could not be computed for "
                    f"runs that predate them ({exc}); their baseline columns are empty."
                )
        split = self._splits[key]
        if split is None:
            return {}
        if isinstance(users, int) and users >= 0 and users != split.n_users:
            note = (
                f"Runs of {cfg.dataset} seed {cfg.seed} kept {users} users but the split "
                f"rebuilt for their baselines has {split.n_users} (the run predates the one "
                "min-interactions filter): their baselines describe a different user set."
            )
            if note not in self.notes:
                self.notes.append(note)
        p = cfg.privacy
        vkey = (key, epsilon, p.delta, p.privacy_unit)
        if vkey not in self._values:
            self._values[vkey] = baseline_metrics(
                split, seed=cfg.seed, epsilon=epsilon, delta=p.delta, privacy_unit=p.privacy_unit
            )
        return self._values[vkey]


def _baseline_columns(
    summary: dict[str, Any],
    cfg: TrainConfig,
    epsilon: float | None,
    backfill: _Baselines,
) -> dict[str, Any]:
    """The row's baselines (from its summary, else from its split), lift and verdict."""
    from securefed.baselines import verdict

    wanted = [*BASELINE_COLUMNS, *(DP_BASELINE_COLUMNS if epsilon is not None else ())]
    values: dict[str, Any] = {k: summary.get(k) for k in wanted}
    source = "summary.json"
    if any(v is None for v in values.values()):
        computed = backfill.for_run(cfg, epsilon, summary.get("users", -1))
        values = {k: computed.get(k) for k in wanted}
        source = "split (computed by the report)" if computed else ""
    row: dict[str, Any] = {k: _f(values.get(k)) for k in (*BASELINE_COLUMNS, *DP_BASELINE_COLUMNS)}
    row["baselines_from"] = source
    for key in ("test_hr@10", "test_full_hr@10"):
        ref, value = row[f"baseline_mostpop_{key}"], _f(summary.get(key))
        row[f"lift_over_mostpop_{key}"] = value / ref if ref > 0 else math.nan
    present = {k: v for k, v in {**summary, **row}.items() if not _missing(v)}
    row["verdict"] = "; ".join(verdict(present))
    return row


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _read_row(run_dir: Path, audit_file: Path | None, backfill: _Baselines) -> dict[str, Any]:
    cfg = TrainConfig.from_dict(load_config_file(run_dir / runs.CONFIG_FILE))
    summary = _read_json(run_dir / runs.SUMMARY_FILE)
    p = cfg.privacy
    role = cfg.spec.role
    defense = {(False, False): "none", (True, False): "dp", (False, True): "secagg"}.get(
        (p.dp, p.secagg), "dp+secagg"
    )
    if p.prior_share is not None:
        # A private mode's row (a private popularity count in the scores, the mode's rounds
        # and cohorts) is never averaged with the model's uploads-only DP rows.
        defense += PRIOR_SUFFIX
    if role == "centralized":
        defense = CENTRALIZED
    spent = summary.get("epsilon")
    target = p.epsilon if p.epsilon is not None else (spent if p.dp else None)
    metrics = runs.read_metrics(run_dir)
    sa = [m["secagg_seconds"] for m in metrics if "secagg_seconds" in m]
    rounds = int(summary.get("rounds", len(metrics)))
    row: dict[str, Any] = {
        "cell": run_dir.name if run_dir.name not in ("run", "replay") else run_dir.parent.name,
        "model": cfg.model,
        "role": role,
        "dataset": summary.get("dataset", cfg.dataset),
        "defense": defense,
        "epsilon": math.inf if target is None else float(target),
        "seed": cfg.seed,
        "rounds": rounds,
        "dp": p.dp,
        "secagg": p.secagg,
        "delta": _f(summary.get("delta")) if p.dp else math.nan,
        "accountant": summary.get("accountant") or "" if p.dp else "",
        "privacy_unit": summary.get("privacy_unit") or "" if p.dp else "",
        "noise_multiplier": _f(summary.get("noise_multiplier")) if p.dp else math.nan,
        "clip": _f(summary.get("clip")),
        # The private popularity prior's share of the budget (NaN: none; docs/privacy.md).
        "prior_share": _f(summary.get("prior_share")),
        "epsilon_spent": _f(spent) if p.dp else math.inf,
    }
    for key in (
        "test_hr@10",
        "test_ndcg@10",
        "test_full_hr@10",
        "test_full_ndcg@10",
        "val_hr@10",
        "val_ndcg@10",
    ):
        row[key] = _f(summary.get(key))
    row["selected_round"] = summary.get("selected_round", -1)
    row["seconds"] = _f(summary.get("seconds"))
    row["train_seconds"] = _f(summary.get("train_seconds"))
    row["seconds_per_round"] = row["train_seconds"] / rounds if rounds else math.nan
    row["secagg_seconds_per_round"] = sum(sa) / len(sa) if sa else math.nan
    row["stopped"] = summary.get("stopped") or ""
    row["users"] = summary.get("users", -1)
    row["synthetic"] = bool(summary.get("synthetic", False))
    dp_epsilon = None if target is None or not p.dp else float(target)
    row.update(_baseline_columns(summary, cfg, dp_epsilon, backfill))
    row.update(_audit_columns(audit_file))
    row["run_dir"] = str(run_dir)
    return row


def _audit_columns(audit_file: Path | None) -> dict[str, Any]:
    if audit_file is None:
        return {"audited": False, "audit_file": "", "audit_error": ""}
    report = _read_json(audit_file)
    if audit_file.name == AUDIT_FAILED:
        return {"audited": False, "audit_file": "", "audit_error": str(report.get("error"))}
    row: dict[str, Any] = {"audited": True, "audit_file": str(audit_file), "audit_error": ""}
    block = report.get("audit") or {}
    row["epsilon_lower_bound"] = _f(block.get("epsilon_lower_bound"))
    row["audit_confidence"] = _f(block.get("confidence"))
    row["audit_method"] = block.get("method") or ""
    for attack in report.get("attacks", []):
        name = attack.get("name")
        metrics = attack.get("metrics") or {}
        if not name or not metrics:
            continue  # skipped under this threat model (e.g. per-client attacks with secagg)
        ci = attack.get("ci95") or {}
        base = attack.get("baseline") or {}
        for key in ("auc", "tpr@1%fpr", "tpr@0.1%fpr", "f1"):
            if key not in metrics:
                continue
            row[f"{name}:{key}"] = _f(metrics.get(key))
            lo_hi = ci.get(key)
            if isinstance(lo_hi, list | tuple) and len(lo_hi) == 2:
                row[f"{name}:{key}:lo"], row[f"{name}:{key}:hi"] = _f(lo_hi[0]), _f(lo_hi[1])
            if key in base:
                row[f"{name}:{key}:baseline"] = _f(base[key])
        row[f"{name}:threat_model"] = attack.get("threat_model", "")
        row[f"{name}:verdict"] = attack.get("verdict") or ""
    return row


def _no_signal_notes(frame: Any) -> list[str]:
    """A sentence per attack whose scores were constant in some cells
    (:data:`attacks.results.NO_SIGNAL`): its AUC of 0.500 there is no attack at chance."""
    from attacks.results import NO_SIGNAL

    out = []
    for column in (c for c in frame.columns if c.endswith(":verdict")):
        cells = [str(c) for c in frame.loc[frame[column] == NO_SIGNAL, "cell"]]
        if cells:
            name = column[: -len(":verdict")]
            out.append(
                f"{name} had no signal in {len(cells)} cell(s) ({', '.join(cells)}): its "
                "scores were constant, so its AUC of 0.500 there measures nothing (it is not "
                "an attack at chance) and is left out of the best attack AUC."
            )
    return out


def collect_results(dirs: Iterable[str | Path], notes: list[str] | None = None) -> Any:
    """One row per run found under ``dirs`` (run, audit or report directories), as a DataFrame.

    Rows are ordered by role (federated models, then baselines, then centralized references),
    model, epsilon, defense and seed. Every row carries its baselines on the same split
    (``baseline_random_*``, ``baseline_mostpop_*`` and, on DP rows, ``baseline_dp_mostpop_*``
    at the row's epsilon), the lift over MostPop and ``verdict`` (the BELOW sentences of
    :func:`securefed.baselines.verdict`, joined by ``; ``). Attack columns are named
    ``<attack>:<metric>`` (plus ``:lo``/``:hi`` for the 95 % interval and ``:baseline``).

    Args:
        dirs: Run, audit or report directories.
        notes: Receives a sentence for every row whose baselines could not be computed or
            describe a different user set.
    """
    import pandas as pd

    found: list[tuple[Path, Path | None]] = []
    for d in dirs:
        found.extend(_find_runs(Path(d)))
    if not found:
        raise DataError("no finished run found in the given directories")
    backfill = _Baselines()
    rows = [_read_row(r, a, backfill) for r, a in found]
    if notes is not None:
        notes.extend(n for n in backfill.notes if n not in notes)
    frame = pd.DataFrame(rows)
    labels = ("none", "dp", "dp+prior", "secagg", "dp+secagg", "dp+secagg+prior", CENTRALIZED)
    order = {d: i for i, d in enumerate(labels)}
    roles = {"federated": 0, "baseline": 1, "centralized": 2}
    frame["_d"] = frame["defense"].map(order)
    frame["_r"] = frame["role"].map(roles)
    frame = frame.sort_values(["_r", "model", "epsilon", "_d", "seed"], kind="stable")
    frame = frame.drop(columns=["_d", "_r"])
    frame = frame.drop_duplicates(subset=["run_dir"]).reset_index(drop=True)
    _refuse_mixed(frame, notes)
    return frame[_in_attack_order(list(frame.columns))]


def _in_attack_order(columns: list[str]) -> list[str]:
    """``columns`` with the attack columns (``<attack>:...``) after the others, in the attack
    registry's order (a result named ``<attack>-<part>``, the attribute attack's per attribute,
    with its attack), each attack's columns in their order: they came in the order the rows
    first held them (a secure-aggregation cell's aggregate attacks before the per-client ones;
    found in a walkthrough)."""
    from attacks.registry import attack_names

    names = attack_names()

    def rank(column: str) -> int:
        result = column.split(":", 1)[0]
        for i, name in enumerate(names):
            if result == name or result.startswith(f"{name}-"):
                return i
        return len(names)  # an attack no longer registered: last

    attack = [c for c in columns if ":" in c]
    others = [c for c in columns if ":" not in c]
    return others + sorted(attack, key=rank)  # stable: each attack's own order kept


def _refuse_mixed(frame: Any, notes: list[str] | None = None) -> None:
    """A report averages each (model, defense, epsilon) over its seeds, so its runs must be of
    one dataset and hold one run per setting and seed: a train run and an audit's run of the
    same seed were read as two seeds, on 300 and 364 users (the audit adds its canaries),
    beside two different MostPop rows (found in a walkthrough). Runs of one dataset on
    different user sets (cells of a report from before the one min-interactions filter) get
    a note in ``notes``.

    Raises:
        DataError: runs of several datasets, or two runs of one setting and seed.
    """
    datasets = sorted({Path(str(d)).name for d in frame["dataset"]})  # log.csv == /abs/log.csv
    if len(datasets) > 1:
        raise DataError(
            f"the runs are of {len(datasets)} datasets ({', '.join(datasets)}): a report "
            "compares runs on one split; build one report per dataset"
        )
    keys = ["model", "defense", "epsilon", "seed"]
    twice = frame[frame.duplicated(subset=keys, keep=False)]
    if len(twice):
        first = twice.iloc[0]
        same = twice[(twice[keys] == first[keys]).all(axis=1)]["run_dir"].tolist()
        raise DataError(
            f"{' and '.join(same)} are both {first['model']} {first['defense']} at epsilon "
            f"{_eps_label(float(first['epsilon']))}, seed {int(first['seed'])}: a report "
            "averages a setting over its seeds, one run each; pass one of them"
        )
    users = sorted({int(u) for u in frame["users"] if int(u) >= 0})
    if len(users) > 1 and notes is not None:
        note = (
            f"The runs hold different user sets ({', '.join(map(str, users))} users of "
            f"{datasets[0]}: other loading settings, or an audit's canary users): rows of "
            "different user sets are not on one split."
        )
        if note not in notes:
            notes.append(note)


def build_report(
    dirs: Sequence[str | Path], out: str | Path, *, min_hr: float | None = None
) -> ReportResult:
    """Build a report from existing run, audit or report directories (no training).

    Args:
        dirs: Directories written by ``securefed train``, ``securefed audit`` or
            ``securefed report`` (a report directory contributes all its cells).
        out: Report directory to write (created).
        min_hr: Utility floor of the summary (see :class:`ReportConfig`).
    """
    from securefed.training import check_run_dir_writable

    check_report_dependencies()
    check_run_dir_writable(Path(out), kind="report directory")
    _refuse_foreign_out(Path(out))
    skipped: list[SkippedCell] = []
    notes: list[str] = []
    for d in dirs:  # skipped combinations recorded by an earlier sweep stay in the report
        sweep = Path(d) / SWEEP_FILE
        if sweep.exists():
            rec = _read_json(sweep)
            for s in rec.get("skipped", []):
                sc = SkippedCell(s["model"], s["defense"], float(s["epsilon"]), s["reason"])
                if sc not in skipped:
                    skipped.append(sc)
            notes.extend(n for n in rec.get("notes", []) if n not in notes)
        cells = Path(d) / CELLS_DIR
        if cells.is_dir():
            unfinished = sorted(
                p.name for p in cells.iterdir() if not (p / runs.SUMMARY_FILE).exists()
            )
            if unfinished:
                notes.append(
                    f"{len(unfinished)} cell(s) under {d} have not finished and are left out: "
                    + ", ".join(unfinished)
                    + "."
                )
    return _build(list(dirs), Path(out), skipped=skipped, notes=notes, min_hr=min_hr)


def _build(
    dirs: Sequence[str | Path],
    out: Path,
    *,
    skipped: list[SkippedCell],
    notes: list[str],
    min_hr: float | None,
) -> ReportResult:
    from securefed.report.html import write_documents
    from securefed.report.plots import draw_figures

    notes = list(notes)
    frame = collect_results(dirs, notes)
    out.mkdir(parents=True, exist_ok=True)
    csv = out / "results.csv"
    parquet = out / "results.parquet"
    runs.atomic_write_text(csv, frame.to_csv(index=False))
    try:
        frame.to_parquet(parquet, index=False)
    except ImportError as exc:
        raise ConfigError(
            f"writing results.parquet needs pyarrow ({exc}); pip install pyarrow"
        ) from None
    for _, row in frame[frame["audit_error"].fillna("") != ""].iterrows():
        notes.append(
            f"The audit of {row['cell']} failed: {row['audit_error']} (its utility is reported; "
            f"delete {row['run_dir']}/{AUDIT_DIR} and rerun to retry the audit)."
        )
    notes.extend(_no_signal_notes(frame))
    if not frame["audited"].any() and not any("audit" in n for n in notes):
        notes.append("No audit.json was found for these runs, so attack figures are omitted.")
    figures, fig_notes = draw_figures(frame, out / "figures")
    notes.extend(fig_notes)
    html, md = write_documents(
        frame, out, figures=figures, skipped=skipped, notes=notes, min_hr=min_hr
    )
    return ReportResult(
        out=out,
        html=html,
        markdown=md,
        csv=csv,
        parquet=parquet,
        figures=figures,
        results=frame,
        skipped=skipped,
        notes=notes,
    )
