"""Stated costs on the command line: the estimate before a run, its update after round 1, the
refusal of a run that cannot fit, and the measured numbers beside the estimate.

A thin layer over :mod:`securefed.costs` for ``securefed train`` (and the audit's replay
training); the numbers and the refusal are the library's, the lines and ``estimate.json`` are
written here.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from securefed.costs import (
    CostEstimate,
    RunShape,
    available_memory,
    check_disk,
    check_synthetic_fits,
    estimate_run,
    fit_memory,
    format_bytes,
    format_seconds,
    machine_speed,
    plural,
    state_bytes_of,
)

if TYPE_CHECKING:
    from securefed.config import TrainConfig
    from securefed.data.types import Split
    from securefed.training import RoundRecord, RunStart, TrainResult

#: The run directory's record of the estimate (and, once the run ends, what was measured).
ESTIMATE_FILE = "estimate.json"


class RunCosts:
    """The estimate of one training run as it goes: checked before the model is built,
    printed and recorded when the run starts, updated after its first rounds, compared with
    what was measured at the end.

    ``line`` prints one line on stderr (the caller's plain or rich output); ``target`` is
    where the run directory goes (``--out`` or ``--resume``; default ``runs``), whose file
    system the disk check reads.
    """

    def __init__(self, line: Callable[[str], None], *, target: Path | None = None) -> None:
        self.line = line
        self.target = Path("runs") if target is None else target
        self.speed: float | None = None
        self.config: TrainConfig | None = None
        self.estimate: CostEstimate | None = None
        self.run_dir: Path | None = None
        self.record: dict[str, Any] = {}
        self.rounds: list[dict[str, Any]] = []
        self.start_round = 0
        self.updates = 0

    def check_before_load(self, config: TrainConfig) -> None:
        """A synthetic dataset that cannot fit is refused before it is generated
        (:func:`securefed.costs.check_synthetic_fits`)."""
        speed = check_synthetic_fits(config)
        if speed is not None:
            self.speed = speed

    def before_build(self, config: TrainConfig, split: Split) -> TrainConfig:
        """``train(before_build=...)``: estimate from the loaded split and refuse a run whose
        peak memory exceeds what is available, or whose disk at its largest exceeds the free
        space where its directory goes (nothing has been allocated or written yet);
        FedRAP's ``views="auto"`` becomes the storage that fits when dense views do not
        (said on one line; ``config.toml`` records it). Returns the config to train."""
        if self.speed is None:
            self.speed = machine_speed()
        estimate = estimate_run(config, RunShape.of(split), speed=self.speed)
        config, chosen, available = fit_memory(config, estimate)
        if chosen is not estimate:
            where = ""
            if config.params.views == "paged":
                size = chosen.state.get("D", 0)
                where = f" in a {format_bytes(size)} file in {config.params.views_dir or '$TMPDIR'}"
            self.line(
                f"private views: {config.params.views}{where} (dense would need about "
                f"{format_bytes(estimate.peak_memory)}, {format_bytes(available or 0)} is "
                "available; same results)"
            )
            estimate = chosen
        check_disk(config, estimate, self.target)
        self.config = config
        self.estimate = estimate
        return config

    def plan_lines(self, model: Any) -> list[str]:
        """The estimate's two lines for a run not started (``--dry-run``): disk from the
        built model's real state; nothing recorded."""
        if self.config is None or self.estimate is None:
            return []
        estimate = self._with_state(model, start_round=0)
        return [estimate.summary_line(), estimate.detail_line()]

    def _with_state(self, model: Any, *, start_round: int) -> CostEstimate:
        """The estimate again, its disk from the built ``model``'s real state."""
        assert self.config is not None and self.estimate is not None
        state = state_bytes_of(model.state_dict()) if model is not None else None
        return estimate_run(
            self.config,
            self.estimate.shape,
            start_round=start_round,
            speed=self.speed,
            state=state,
        )

    def start(self, start: RunStart) -> None:
        """Print the estimate (disk from the built model's real state) and record it."""
        if self.config is None or self.estimate is None:
            return
        self.start_round = start.start_round
        self.estimate = self._with_state(start.model, start_round=start.start_round)
        self.run_dir = start.run_dir
        self.line(self.estimate.summary_line())
        self.line(self.estimate.detail_line())
        self.record = {
            "before_run": self.estimate.to_dict(),
            "available_memory": available_memory(),
        }
        self._write()

    def round(self, rec: RoundRecord) -> None:
        """After round 1 (and round 2 when round 1 carried one-off costs): the time left,
        re-estimated from the measured rounds."""
        if self.estimate is None:
            return
        self.rounds.append(dict(rec.values))
        n = len(self.rounds)
        if n > 2 or rec.round == rec.rounds_planned:
            return
        done = self.start_round + n
        updated = self.estimate.after_rounds(self.rounds, done=done)
        compiled = self.estimate.setup_seconds > 0 and self.start_round == 0
        if n == 2:
            first = self.rounds[0].get("train_seconds", 0.0)
            # Round 1 was a warm-up (torch.compile, first allocations): say so once more.
            if not compiled and first < 1.5 * updated.round_seconds:
                return
        self.line(
            f"estimate after round {rec.round}: {format_seconds(updated.seconds)} left "
            f"({plural(updated.rounds, 'round')} x {format_seconds(updated.round_seconds)} "
            "training"
            + (
                f" + {plural(updated.evaluations, 'evaluation')} x "
                f"{format_seconds(_eval_mean(updated))}"
                if updated.evaluations
                else ""
            )
            + ")"
            + (
                "; round 1 included torch.compile, so this is high: re-estimated after round 2"
                if compiled and n == 1
                else ""
            )
        )
        self.record[f"after_round_{rec.round}"] = updated.to_dict()
        self._write()

    def finish(self, result: TrainResult) -> None:
        """Record what the run measured beside the estimate (peak RSS, seconds, disk)."""
        if self.estimate is None or self.run_dir is None:
            return
        self.record["measured"] = {
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "seconds": result.summary.get("seconds"),
            "train_seconds": result.summary.get("train_seconds"),
            "rounds": result.summary.get("rounds"),
            # As written while the run trained (a finished run removes it afterwards).
            "checkpoint_bytes": result.checkpoint_bytes,
            "run_dir_bytes": sum(
                p.stat().st_size for p in result.run_dir.rglob("*") if p.is_file()
            ),
        }
        self._write()

    def _write(self) -> None:
        if self.run_dir is None or not self.run_dir.exists():
            return
        from securefed import runs

        runs.write_json(self.run_dir / ESTIMATE_FILE, self.record)


def _eval_mean(e: CostEstimate) -> float:
    if not e.evaluations:
        return 0.0
    sampled = e.evaluations - e.full_evaluations
    return (sampled * e.eval_seconds + e.full_evaluations * e.full_eval_seconds) / e.evaluations
