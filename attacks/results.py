"""What an audit is asked for and what each attack returns: the types shared by the audit
orchestration (:mod:`attacks.audit`) and the scorer (:mod:`attacks.report`), so that neither
imports the other's module for them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attacks.registry import attack_names
from securefed.config import TrainConfig
from securefed.errors import ConfigError
from securefed.validation import check_field_types

__all__ = ["NO_SIGNAL", "RELEASE_NOTE", "RELEASED_FILE", "AttackResult", "AuditConfig"]

#: The released global model, saved under the recording for the release-observer attack.
RELEASED_FILE = "released.pt"
RELEASE_NOTE = "the global model released after the last round, and each target's interactions"
#: The verdict of an attack whose scores are all equal (``metrics["constant_scores"]``): its
#: AUC of 1/2 and its interval of width 0 measure no attack at chance, only that nothing
#: told one user from another.
NO_SIGNAL = "no signal: the scores are constant"


@dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """What to train (or load) and which attacks to run.

    Attributes:
        train: The run to attack (ignored with ``run``, which brings its own config).
        attacks: Attack names (:func:`attacks.registry.attack_names`) or ``("all",)``: every
            attack the threat models and the model allow (per-client attacks are skipped
            under secure aggregation, model-specific ones for other models).
        run: A run directory to load instead of training: reuses the statistics an earlier
            audit recorded there, else re-simulates it from its ``config.toml``.
        canaries: Canary clients of the DP audit (default 256); 0 disables the audit.
        target_users: Targets of the optimisation inversion.
        imia_iterations: Refinement iterations of the IMIA shadow attack (one shadow round of
            every target client each).
        released_iterations: L-BFGS iterations of the released-model attack's fit per chunk
            of users (30: FedRecGEL's fit loss is within 2 % of 100 iterations' on MovieLens
            100K at a third of the cost).
        known_fraction: Share of users whose attribute the attribute attacker knows.
        bootstrap: Bootstrap resamples of the 95 % intervals.
        confidence: Confidence of the epsilon lower bound.
        keep_recording: Keep what the observer recorded (``record/``, ``accumulators.npz``
            and ``audit_meta.json`` under the audit's run directory), so a later audit with
            ``run`` set to that directory rescores it without training. Otherwise it is
            written to a temporary folder inside the output directory and removed once the
            attacks are scored.
    """

    train: TrainConfig = field(default_factory=TrainConfig)
    attacks: tuple[str, ...] = ("all",)
    run: str | None = None
    canaries: int | None = None
    target_users: int = 16
    imia_iterations: int = 5
    released_iterations: int = 30
    known_fraction: float = 0.5
    bootstrap: int = 200
    confidence: float = 0.95
    keep_recording: bool = False

    def __post_init__(self) -> None:
        # Types first: attacks="all" was read a letter at a time ("unknown attack 'a'"), and
        # train={"model": "fedals"} failed deep inside the audit with an AttributeError.
        if isinstance(self.train, Mapping):
            object.__setattr__(self, "train", TrainConfig.from_dict(self.train))
        if not isinstance(self.train, TrainConfig):
            raise ConfigError(
                f"train must be a TrainConfig (or a mapping of its settings), got "
                f"{type(self.train).__name__}"
            )
        check_field_types(self)
        names = tuple(self.attacks)
        object.__setattr__(self, "attacks", names)
        if not names:
            raise ConfigError("attacks must name at least one attack, or 'all'")
        known = attack_names()
        unknown = [a for a in names if a != "all" and a not in known]
        if unknown:
            raise ConfigError(
                f"unknown attack {unknown[0]!r}; choose 'all' or from {', '.join(known)}"
            )
        if "all" in names and len(names) > 1:
            raise ConfigError("give either 'all' or a list of attacks, not both")
        if self.canaries is not None and (not isinstance(self.canaries, int) or self.canaries < 0):
            raise ConfigError(f"canaries must be an integer >= 0, got {self.canaries!r}")
        if not isinstance(self.target_users, int) or self.target_users < 0:
            raise ConfigError(f"target users must be an integer >= 0, got {self.target_users!r}")
        if (
            not isinstance(self.imia_iterations, int)
            or isinstance(self.imia_iterations, bool)
            or not 1 <= self.imia_iterations <= 100
        ):
            raise ConfigError(
                f"IMIA iterations must be an integer in [1, 100], got {self.imia_iterations!r}"
            )
        if (
            not isinstance(self.released_iterations, int)
            or isinstance(self.released_iterations, bool)
            or not 1 <= self.released_iterations <= 1000
        ):
            raise ConfigError(
                "released-model iterations must be an integer in [1, 1000], got "
                f"{self.released_iterations!r}"
            )
        if not 0 < self.known_fraction < 1:
            raise ConfigError(f"known fraction must be in (0, 1), got {self.known_fraction!r}")
        if not isinstance(self.bootstrap, int) or self.bootstrap < 10:
            raise ConfigError(f"bootstrap must be an integer >= 10, got {self.bootstrap!r}")
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"confidence must be in [0.5, 1), got {self.confidence!r}")


@dataclass(frozen=True)
class AttackResult:
    """One attack's outcome, as written into ``audit.json``."""

    name: str
    threat_model: str
    metrics: dict[str, Any]
    ci95: dict[str, Any]
    baseline: dict[str, Any]
    note: str = ""
    observes: str = ""
    #: Wall seconds spent scoring it after the run (what the recorder spent during the
    #: training or replay is in ``audit.json``'s ``seconds.train``).
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        """How the attack compares with chance, from its AUC interval (:func:`auc_verdict`)."""
        return auc_verdict(self.metrics, self.ci95, self.baseline)

    def as_dict(self) -> dict[str, Any]:
        """The result as plain values with its verdict (an entry of ``audit.json``)."""
        out = dataclasses.asdict(self)
        out["verdict"] = self.verdict
        return out


def auc_verdict(
    metrics: Mapping[str, Any], ci95: Mapping[str, Any], baseline: Mapping[str, Any]
) -> str:
    """``"above chance"``, ``"chance level"`` or ``"BELOW CHANCE"`` from the AUC's 95 % interval
    against the random baseline's AUC (1/2); :data:`NO_SIGNAL` when the scores are constant
    (``metrics["constant_scores"]``); ``""`` without an AUC.

    Below chance means the attack's scores rank members *below* non-members more often than
    not: it learned the signal with the wrong sign (its mirror would score ``1 - AUC``), so
    it is a broken attack, not evidence of privacy.
    """
    if metrics.get("constant_scores"):
        return NO_SIGNAL
    auc = metrics.get("auc")
    lo_hi = ci95.get("auc")
    base = baseline.get("auc", 0.5)
    if not isinstance(auc, int | float) or not math.isfinite(auc):
        return ""
    lo, hi = (
        (float(lo_hi[0]), float(lo_hi[1]))
        if isinstance(lo_hi, list | tuple) and len(lo_hi) == 2
        else (float(auc), float(auc))
    )
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo = hi = float(auc)
    if lo > base:
        return "above chance"
    if hi < base:
        return "BELOW CHANCE"
    return "chance level"
