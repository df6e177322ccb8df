"""The attack seam: every attack is an :class:`AttackSpec`, found by name in :data:`_MODULES`.

A new attack is one module defining ``SPEC = AttackSpec(...)`` plus one line in
:data:`_MODULES` (a module defining several attacks gives ``SPECS``, a name -> spec mapping).
The audit asks the spec which threat model an attack belongs to (per-client attacks are
skipped under secure aggregation and for a model whose uploads have no per-item rows), what
the recorder must keep for it (:attr:`AttackSpec.reads`), how many ``[users, items]`` score
matrices it holds (the memory check) and, for an attack written against named models, which;
then it calls :attr:`AttackSpec.score` with a :class:`ScoreContext`. Modules are imported on
first use, as the model registry's are.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from attacks.threat import ThreatModel
from securefed.errors import ConfigError

if TYPE_CHECKING:
    from attacks.results import AttackResult, AuditConfig
    from securefed.config import TrainConfig
    from securefed.data.types import Split

__all__ = [
    "AttackSpec",
    "ScoreContext",
    "attack_names",
    "get_attack",
    "per_client_attacks",
    "recorder_groups",
]

#: What the round recorder can keep for an attack (:mod:`attacks.recorder`): ``upload`` the
#: per-user item tables of every observed upload (first change, first label, sums, counts);
#: ``imia`` the online IMIA shadow scores; ``union`` / ``differencing`` their round-0
#: aggregate statistics; ``targets`` the first upload of a few target users; ``release`` the
#: global model released after the last round.
RecorderGroup = Literal["upload", "imia", "union", "differencing", "targets", "release"]

#: Attack name -> module defining its spec, in report order.
_MODULES: dict[str, str] = {
    "row-change": "attacks.report",
    "intersection": "attacks.report",
    "gradient-ratio": "attacks.report",
    "optimization": "attacks.report",
    "attribute": "attacks.report",
    "imia": "attacks.report",
    "union": "attacks.report",
    "differencing": "attacks.report",
    "released": "attacks.report",
}
_CACHE: dict[str, AttackSpec] = {}


@dataclass(frozen=True, kw_only=True)
class ScoreContext:
    """What an attack's scorer reads after the run (real users only, canaries removed).

    Attributes:
        acc: The recorder's accumulators by name (docs/attacks.md, "Adding an attack"):
            ``[users, items]`` tables, only those the chosen attacks' ``reads`` record (asking
            for another is a KeyError naming the ``reads`` entry that records it), and
            ``[users]`` arrays.
        labels: ``[users, items]`` boolean membership labels: True for a user's training
            items, False for every other item.
        rng: This attack's own bootstrap generator (from the run's seed and its name).
        arrays: Score arrays written to ``scores.npz``; a scorer adds its own under its name.
        record_dir: Where the recorder wrote its per-round files.
        split: The run's split.
        n_real: Real (non-canary) items.
        n_real_users: Real (non-canary) users.
        targets: Target users of the ``targets`` recording.
        union_by_k: The union attack's simulated cohort sums.
        train_cfg: The attacked run's config.
        cfg: The audit's config.
    """

    acc: dict[str, np.ndarray]
    labels: np.ndarray
    rng: np.random.Generator
    arrays: dict[str, np.ndarray]
    record_dir: Path
    split: Split
    n_real: int
    n_real_users: int
    targets: list[int]
    union_by_k: dict[int, dict[str, Any]]
    train_cfg: TrainConfig
    cfg: AuditConfig

    @property
    def n_boot(self) -> int:
        return self.cfg.bootstrap

    def membership(
        self, name: str, scores: np.ndarray, threat: ThreatModel, note: str, **extra: Any
    ) -> AttackResult:
        """A membership-inference result from ``[users, items]`` scores: AUC, TPR at 1 % FPR
        and their bootstrap intervals against chance; the scores go to ``scores.npz``."""
        from attacks.metrics import membership_report
        from attacks.results import AttackResult

        metrics, ci, base = membership_report(scores, self.labels, rng=self.rng, n_boot=self.n_boot)
        metrics.update(extra)
        self.arrays[name] = np.asarray(scores, dtype=np.float32)  # no copy when already float32
        return AttackResult(name, threat.value, metrics, ci, base, note)


@dataclass(frozen=True, kw_only=True)
class AttackSpec:
    """One attack.

    Attributes:
        name: Its name (``--attacks``).
        threat: Who observes what it reads; an upload observer's attack is per client.
        score: ``ScoreContext -> list[AttackResult]`` (usually one; one per attribute for
            the attribute attack); a single result is taken as a list of one.
        reads: What the recorder keeps for it (:data:`RecorderGroup`).
        score_matrices: ``[users, items]`` float32 score matrices it keeps (memory check).
        models: The models it is written for (a shadow client, a fit of a user); None: any
            model whose uploads the threat model observes.
        label_matrices: Extra ``[users, items]`` boolean label matrices it keeps.
        full_evals: ``AuditConfig -> float``: its scoring's cost in full-ranking evaluations
            of the model (an iterative fit), for the audit's time estimate; None: none.
    """

    name: str
    threat: ThreatModel
    score: Callable[[ScoreContext], list[AttackResult] | AttackResult]
    reads: tuple[RecorderGroup, ...] = ()
    score_matrices: int = 1
    models: tuple[str, ...] | None = None
    label_matrices: int = 0
    full_evals: Callable[[AuditConfig], float] | None = None

    @property
    def per_client(self) -> bool:
        """Whether it needs per-client uploads (skipped under secure aggregation)."""
        return self.threat is ThreatModel.UPLOAD_OBSERVER


def attack_names() -> tuple[str, ...]:
    """Every registered attack, in report order."""
    return tuple(_MODULES)


def get_attack(name: str) -> AttackSpec:
    """The :class:`AttackSpec` of ``name`` (its module is imported on first use)."""
    if name not in _MODULES:
        raise ConfigError(f"unknown attack {name!r}; choose 'all' or from {', '.join(_MODULES)}")
    spec = _CACHE.get(name)
    if spec is None:
        module = importlib.import_module(_MODULES[name])
        specs = getattr(module, "SPECS", None)
        spec = specs.get(name) if specs is not None else getattr(module, "SPEC", None)
        if not isinstance(spec, AttackSpec) or spec.name != name:
            raise TypeError(f"{_MODULES[name]} must define the AttackSpec named {name!r}")
        _CACHE[name] = spec
    return spec


def per_client_attacks() -> frozenset[str]:
    """The attacks that need per-client uploads."""
    return frozenset(n for n in _MODULES if get_attack(n).per_client)


def recorder_groups(attacks: Iterable[str]) -> frozenset[str]:
    """What the recorder keeps for ``attacks`` (the union of their :attr:`AttackSpec.reads`)."""
    return frozenset(g for a in attacks for g in get_attack(a).reads)
