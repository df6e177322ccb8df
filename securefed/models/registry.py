"""The model registry: one :class:`ModelSpec` per recommender, looked up by name.

Training, privacy, audit, report, the CLI and the Flower apps ask the registry what a model
is and what it supports; none of them tests a model's name. A new model is one module that
defines its class, its hyperparameter dataclass and a module-level ``SPEC = ModelSpec(...)``,
plus one line in :data:`_MODULES`. Modules are imported on first use, so listing the names
(``securefed --help``) imports no model code.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from securefed.errors import ConfigError
from securefed.validation import SCALAR_KINDS, check_field_type

if TYPE_CHECKING:
    import torch

    from securefed.costs import ModelCosts
    from securefed.data.types import Split
    from securefed.federation.cohort import CohortSpec

    _CanaryExtra = Callable[[torch.Tensor, dict[str, torch.Tensor], torch.Tensor], torch.Tensor]

__all__ = [
    "DEFAULT_MODEL",
    "ModelSpec",
    "ObserverHooks",
    "PrivateMode",
    "get_spec",
    "model_names",
    "params_from_flags",
]

#: Every model's module, in the order help texts and reports list them. One line per model.
_MODULES: dict[str, str] = {
    "fedals": "securefed.models.fedals",
    "fedrap": "securefed.models.fedrap",
    "fedrecgel": "securefed.models.fedrecgel",
    "mostpop": "securefed.models.mostpop",
    "ease": "securefed.models.ease",
    "ials": "securefed.models.ials",
}

#: The model ``securefed train`` trains when none is named (docs/results.md says why).
DEFAULT_MODEL = "fedals"

Role = Literal["federated", "baseline", "centralized"]


@dataclass(frozen=True)
class ObserverHooks:
    """How an observer of the uploads reads one model's update (the attacks' view).

    Each function is model knowledge, not attack logic: where the item rows sit in a flat
    upload, which private vector a row is collinear with, and which direction a training
    positive pushes its row.

    Attributes:
        item_rows: ``(flat [c, d], global_before, n_items) -> (rows [c, n_items, k],
            ratio_rows [c, n_items, k'])``: the per-item residual rows of the uploads, and the
            rows collinear with the client's private direction.
        private_vectors: ``model -> [n_users, k']``: each user's private vector (read only to
            *score* an inversion and to aim the auditor's own canaries).
        truth_direction: ``(private [b, k'], global_before) -> [b, k']``: the direction a
            training positive pushes its ratio row.
        recovered_embedding: ``(direction [b, k'], global_before) -> [b, k']``: the private
            vector an observer recovers from an estimated ratio-row direction.
        ratio_width: ``global_before -> k'``: the width of a ratio row. The ratio rows of item
            ``i`` are coordinates ``[i * k', (i + 1) * k')`` of the flat upload (the layout
            starts with them), which the canary audit reads unless ``canary_rows`` says
            otherwise.
        canary_sign: ``(seen_before [b] bool, unit) -> [b] float``: +1 where a canary's push
            keeps ``truth_direction``, -1 where it flips after the first round, 0 where its sign
            is unknown (not scored). None: always +1.
        positives_minority: Whether training positives are the minority of a client's changed
            rows (the model samples negatives), which orients the ratio direction; False when
            every changed row is a positive.
        upload_against: ``(updates, global_before) -> updates``: the uploads as they left the
            clients, for update types that refer to server state the server step changes
            (FedRAP's refers to the live ``C``). None: the updates as they are.
        canary_rows: ``(flat [c, d], global_before, n_items) -> [c, n_items, k]``: every
            coordinate of an upload or a released sum that item ``i``'s data enters, which the
            canary audit reads (fedals: the item's gradient row and its count, since a count
            round releases only the count). None: the ratio rows.
        canary_own_direction: Whether the canary test projects a canary's coordinates on the
            canary client's own clipped contribution to them (the auditor owns the canary and
            forms its upload) rather than on ``truth_direction`` with ``canary_sign``: for
            models whose push on an item's coordinates changes form between rounds (fedals's
            count and ALS rounds, whose first ALS round pushes along ``+x_u``).
        canary_items: Fresh items per user-level canary (attacks/canaries.py): 2 for a
            model that releases item pairs, so that each canary owns a pair.
        prepare_audit: ``(config, n_items) -> config``: the run's config adapted to an
            audit whose canary items are the last ``n_items`` of the planted catalogue
            (fedals: its co-occurrence rounds release their pairs too). None: unchanged.
        canary_extra: ``(flat [c, d], global_before, items [c]) -> [c, e]``: coordinates
            of row ``r`` of ``flat`` that item ``items[r]``'s data enters beyond its
            ``canary_rows`` (fedals: the item's row of the released co-occurrence), read by
            the canary test beside them. None: none.
    """

    item_rows: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    private_vectors: Callable[[Any], torch.Tensor]
    truth_direction: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]
    recovered_embedding: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]
    ratio_width: Callable[[dict[str, torch.Tensor]], int]
    canary_sign: Callable[[torch.Tensor, str], torch.Tensor] | None = None
    positives_minority: bool = True
    upload_against: Callable[[Any, dict[str, torch.Tensor]], Any] | None = None
    canary_rows: Callable[..., torch.Tensor] | None = None
    canary_own_direction: bool = False
    canary_items: int = 1
    prepare_audit: Callable[[Any, int], Any] | None = None
    canary_extra: _CanaryExtra | None = None


def _all_cohort(n_users: int) -> CohortSpec | None:
    return None


@dataclass(frozen=True, kw_only=True)
class PrivateMode:
    """A model's private mode under user-level DP with central noise, as a user asks for it
    (``securefed train`` flags) and as ``securefed report`` runs its ``dp`` cells: a share of
    the budget on the private popularity prior (:mod:`securefed.prior`), the rounds and the
    Poisson cohort rate its measurements used (docs/privacy.md, "Private FedRAP and
    FedRecGEL"). A model whose private mode needs no flags (fedals) has none."""

    prior_share: float
    rounds: int
    client_fraction: float

    def config_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The mode as :class:`~securefed.TrainConfig` fields and
        :class:`~securefed.PrivacyConfig` fields (beside the run's epsilon)."""
        return (
            {"rounds": self.rounds, "client_fraction": self.client_fraction},
            {"prior_share": self.prior_share},
        )

    @staticmethod
    def refusal(privacy: Mapping[str, Any]) -> str | None:
        """Why a run with these ``[privacy]`` settings cannot take a private mode (one line
        naming the flags to change), or None where it can: ``securefed train --private-mode``
        refuses with it, and a run that could take the mode is told so before it starts."""
        if privacy.get("epsilon") is None or privacy.get("noise_multiplier") is not None:
            return (
                "--private-mode spends a target --epsilon (a share of it on a private "
                "popularity count); give --epsilon and no --noise-multiplier"
            )
        if privacy.get("privacy_unit", "user") != "user":
            return "--private-mode is a user-level mode; use --privacy-unit user"
        if privacy.get("secagg") and privacy.get("noise") != "central":
            return (
                "--private-mode releases its popularity count with central noise; with "
                "--secagg give --noise central, or drop --private-mode"
            )
        return None

    def flags(self) -> str:
        """The ``securefed train`` flags of the mode."""
        return (
            f"--private-prior {self.prior_share:g} --rounds {self.rounds} "
            f"--client-fraction {self.client_fraction:g}"
        )


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What a model is and what it supports, declared once in its own module.

    Attributes:
        name: Registry name (``--model``).
        title: One line for help texts and reports (with the paper it follows).
        params: Its frozen, keyword-only hyperparameter dataclass (``[<name>]`` in config.toml).
        build: ``build(split, params, *, generator, device, dpsgd, noise_seed)`` -> the model.
        role: ``federated`` (clients train, the server sees uploads), ``baseline`` (a federated
            statistic such as popularity), or ``centralized`` (a reference that sees all data:
            refused under DP and secure aggregation, labelled as such in every output).
        default_rounds: Rounds when ``--rounds`` is not given: a number, or a function of the
            run's :class:`~securefed.config.PrivacyConfig` (a private mode may want fewer).
        cohort: The paper's cohort for ``n_users`` (None: every client every round).
        full_eval_every: Full-ranking evaluation cadence when not given.
        dp_clip: Default L2 clip of one client's upload under user-level DP, a number or a
            function of the hyperparameters (None: user-level DP unsupported).
        example_clip: Default per-example clip of interaction-level DP-SGD (None: unsupported).
        interaction_releases: ``params -> int``: Gaussian releases one interaction enters per
            round under DP-SGD.
        layout_size: ``(params, split) -> int``: floats in one flat upload.
        cli_params: CLI flag name -> hyperparameter field, where they differ
            (``--dim`` is FedRecGEL's ``gmf_dim``).
        private_state: ``state_dict`` entries indexed by user first (a Flower node keeps them).
        schedule_scalars: ``state_dict`` scalars the server sends with the shared tensors.
        observer: How attacks read the uploads (None: per-client attacks do not apply).
        unsupported_attacks: Attack name -> why it does not apply to this model.
        resolve_params: ``(params, privacy) -> params``: settings that depend on the defenses
            (MostPop bounds each user's contribution under DP), applied when the run's config is
            built, so ``config.toml`` records what ran.
        resolve_for_data: ``(config, split) -> (config, note)``: settings that depend on
            the loaded data's public size (fedals's population rule), applied once when a new
            run's data is loaded, before anything is built, so ``config.toml`` records what
            ran; ``note`` (or None) is one line saying what was chosen and why.
        prior_weight: The default weight of the privately released popularity prior added to
            the model's scores under ``--private-prior`` (:mod:`securefed.prior`); None: the
            model has no such mode.
        private_mode: The flags of its private mode under user-level DP with central noise
            (:class:`PrivateMode`), which ``securefed report`` runs as the ``dp`` cells and the
            CLI suggests after a run below DP-MostPop without them; None: no such flags.
        prior_scale: How the prior's released counts become scores: ``"log"`` (``log(1 +
            c) / max log(1 + c)``), ``"linear"`` (``c / max c``) or ``"noise"`` (``c`` over
            the release's noise std per count), see
            :meth:`securefed.prior.PopularityPrior.scores`.
        streams_uploads: Its uploads give any block of coordinates of every client in work
            proportional to the block (``ClientUpdates.dense_block``), so a secure round too
            large to hold as ``[clients, d]`` ring inputs is encoded and masked a block at a
            time (:data:`securefed.privacy.STREAM_RING_WORDS`); the cost estimate counts the
            blocks instead of the table.
        costs: Its cost formulas (:class:`securefed.costs.ModelCosts`: state bytes, a round's
            and an evaluation's time and memory), which ``securefed train``'s estimate and
            memory check read; None: estimated as a popularity count, and the estimate says
            so.
    """

    name: str
    title: str
    params: type
    build: Callable[..., Any]
    role: Role = "federated"
    default_rounds: int | Callable[[Any], int] = 100
    cohort: Callable[[int], CohortSpec | None] = _all_cohort
    full_eval_every: int = 1
    dp_clip: float | Callable[[Any], float] | None = None
    example_clip: float | None = None
    interaction_releases: Callable[[Any], int] | None = None
    layout_size: Callable[[Any, Split], int] | None = None
    cli_params: Mapping[str, str] = field(default_factory=dict)
    private_state: tuple[str, ...] = ()
    schedule_scalars: tuple[str, ...] = ()
    observer: ObserverHooks | None = None
    unsupported_attacks: Mapping[str, str] = field(default_factory=dict)
    resolve_params: Callable[[Any, Any], Any] | None = None
    resolve_for_data: Callable[[Any, Split], tuple[Any, str | None]] | None = None
    prior_weight: float | None = None
    private_mode: PrivateMode | None = None
    prior_scale: Literal["log", "linear", "noise"] = "log"
    streams_uploads: bool = False
    costs: ModelCosts | None = None

    def rounds_for(self, privacy: Any) -> int:
        """The default number of rounds under ``privacy``."""
        rounds = self.default_rounds
        return int(rounds(privacy) if callable(rounds) else rounds)

    def default_clip(self, params: Any) -> float | None:
        """The default user-level clip for ``params`` (None when unsupported)."""
        if self.dp_clip is None:
            return None
        return float(self.dp_clip(params) if callable(self.dp_clip) else self.dp_clip)

    @property
    def federated(self) -> bool:
        """Whether clients keep their data (False for centralized references)."""
        return self.role != "centralized"

    @property
    def replays_on_nodes(self) -> bool:
        """Whether a Flower node can replay the in-process round: the model class has
        ``plan_round`` (the whole cohort's plan from the round's generator) and
        ``train_subset`` (the node's rows of it); a run without DP, or with
        ``--replay-from-seed``, needs both on Flower."""
        return all(callable(getattr(self.build, m, None)) for m in ("plan_round", "train_subset"))

    @property
    def user_dp(self) -> bool:
        return self.dp_clip is not None

    @property
    def interaction_dp(self) -> bool:
        return self.example_clip is not None and self.interaction_releases is not None

    def default_params(self) -> Any:
        return self.params()

    def check_params(self, params: Any) -> Any:
        """``params`` if it is this model's hyperparameter type, else a ConfigError."""
        if params is None:
            return self.params()
        if not isinstance(params, self.params):
            raise ConfigError(
                f"model {self.name} takes {self.params.__name__} hyperparameters, got "
                f"{type(params).__name__}"
            )
        return params

    def params_from_mapping(self, values: Mapping[str, Any], *, section: str) -> Any:
        """Hyperparameters from a TOML table (unknown keys are errors)."""
        return dataclass_from_table(self.params, values, section=section)


def dataclass_from_table(kind: type, values: Mapping[str, Any], *, section: str) -> Any:
    """An instance of the config dataclass ``kind`` from a TOML table: unknown keys and bad
    values are one ConfigError naming ``[section]``; lists become tuples."""
    known = {f.name: f for f in dataclasses.fields(kind)}
    clean: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(
                f"unknown key {key!r} in [{section}]; known keys: {', '.join(sorted(known))}"
            )
        clean[key] = tuple(value) if isinstance(value, list) else value
        check_field_type(known[key], value, where=f"[{section}] ")
    try:
        return kind(**clean)
    except TypeError as exc:
        raise ConfigError(f"invalid [{section}] config: {exc}") from None


_CACHE: dict[str, ModelSpec] = {}


def model_names(role: Role | None = None) -> tuple[str, ...]:
    """Registered model names (all, or those of one role), in registry order."""
    if role is None:
        return tuple(_MODULES)
    return tuple(n for n in _MODULES if get_spec(n).role == role)


def get_spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of ``name`` (its module is imported on first use)."""
    if name not in _MODULES:
        raise ConfigError(f"model must be one of {', '.join(_MODULES)}, got {name!r}")
    spec = _CACHE.get(name)
    if spec is None:
        module = importlib.import_module(_MODULES[name])
        spec = module.SPEC
        if not isinstance(spec, ModelSpec) or spec.name != name:
            raise TypeError(f"{_MODULES[name]}.SPEC must be the ModelSpec named {name!r}")
        _CACHE[name] = spec
    return spec


def _typed(model: str, name: str, annotation: Any, value: Any) -> Any:
    """``value`` checked against a settings field's annotation (``bool``, ``int``, ``float``,
    optionally ``| None``): ``--param private=maybe`` was kept as the string "maybe", which
    reads as true. Other annotations pass through (the settings' own checks apply)."""
    kinds = {part.strip() for part in str(annotation).split("|")}
    if value is None and "None" in kinds:
        return value
    base = kinds - {"None"}
    kind = next(iter(base)) if len(base) == 1 else ""
    if kind not in ("bool", "int", "float"):
        return value
    phrase, fits = SCALAR_KINDS[kind]
    if not fits(value):
        raise ConfigError(f"{model} setting {name} is {phrase}, got {value!r}")
    return float(value) if kind == "float" else value


def params_from_flags(
    spec: ModelSpec,
    flags: Mapping[str, Any],
    base: Any = None,
    *,
    given_as: Mapping[str, str] | None = None,
) -> Any:
    """``base`` (or the defaults) with the CLI's model flags applied.

    ``flags`` maps CLI names (``dim``, ``local_epochs``, or any field given as
    ``--param key=value``) to values; a flag the model has no field for is an error that
    names the model's fields, and the flag as the user gave it (``given_as``: ``lam`` ->
    ``--lambda``, ``dimm`` -> ``--param dimm``; by default ``--`` and the name).
    """
    params = base if base is not None else spec.params()
    known = {f.name: f for f in dataclasses.fields(spec.params)}
    changes: dict[str, Any] = {}
    for flag, value in flags.items():
        name = spec.cli_params.get(flag, flag)
        if name not in known:
            shown = (given_as or {}).get(flag, f"--{flag.replace('_', '-')}")
            raise ConfigError(
                f"{shown} is not a setting of {spec.name}; its settings: "
                f"{', '.join(sorted(known))} (give them as --param key=value)"
            )
        changes[name] = _typed(spec.name, name, known[name].type, value)
    try:
        return dataclasses.replace(params, **changes)
    except TypeError as exc:
        raise ConfigError(f"invalid {spec.name} setting: {exc}") from None
