"""The typed configuration of a run: what to train, on what data, under which defenses.

:class:`TrainConfig` and :class:`PrivacyConfig` are frozen, keyword-only and validated when
built; ``config.toml`` in every run directory is :meth:`TrainConfig.to_dict` of the resolved
config. The model's own hyperparameters sit in a table named after the model (``[fedals]``),
typed by its registry entry (:mod:`securefed.models.registry`).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from securefed.errors import ConfigError
from securefed.federation.cohort import CohortSpec
from securefed.models.registry import (
    DEFAULT_MODEL,
    dataclass_from_table,
    get_spec,
    model_names,
)
from securefed.validation import KeywordSettings, check_field_types

#: Users with fewer interactions are dropped before the split, for every model alike, so that
#: all models and baselines of a dataset and seed are evaluated on the same users and items.
DEFAULT_MIN_INTERACTIONS = 5
#: Rounds between checkpoints of an in-process run, unless given.
DEFAULT_CHECKPOINT_EVERY = 10
#: Rounds between checkpoints of a Flower run, unless given
#: (:meth:`TrainConfig.resolved_checkpoint_every`).
FLOWER_CHECKPOINT_EVERY = 1
#: The smallest positive noise multiplier accepted: its square must stay a normal float64
#: for the accountants (1e-300 made Opacus divide by zero). Any sigma below ~0.3 promises
#: nothing anyway; this bound only turns a crash into a clear error.
MIN_NOISE_MULTIPLIER = 2.0**-500


@dataclass(frozen=True, kw_only=True)
class PrivacyConfig(KeywordSettings):
    """Differential privacy and secure aggregation settings of a run (off by default).

    ``epsilon`` alone calibrates the noise multiplier for the configured rounds and sampling;
    ``noise_multiplier`` alone fixes it and reports the epsilon spent; both together fix the
    noise and treat ``epsilon`` as a budget cap: a round that would overspend is refused and
    the run stops cleanly (``summary["stopped"]``) with its checkpoint kept.

    ``privacy_unit="interaction"`` (FedRAP and FedRecGEL) makes the clients run DP-SGD on their own
    interactions: ``epsilon``/``noise_multiplier`` then refer to one interaction, and
    ``example_clip`` bounds one example's gradient. No user-level noise is added in that
    mode (one unit per run); ``clip`` is then only the secure-aggregation input bound.

    Randomness: every DP run draws its DP noise, its cohorts and the secure-aggregation public
    seed from OS randomness (``os.urandom``), never from ``seed``, so nothing in the run
    directory lets anyone regenerate them (:attr:`os_randomness`). ``replay=True``
    (``--replay-from-seed``) derives them from the run seed instead: the run reproduces bit for
    bit, and its guarantee then holds only against an observer who does not know the seed
    (recorded and printed with the run). So do, in a DP run, a device's item sample, local
    training's negatives and batches, the secure sum's rounding and the simulated dropouts
    (each would otherwise let one user's data move other users' draws; docs/privacy.md).
    Randomness no DP claim relies on (initialisation, indexed by the public population; the
    split, keyed by each interaction's own user and item; evaluation negatives) is derived
    from the seed.
    """

    epsilon: float | None = None
    delta: float = 1e-5
    noise_multiplier: float | None = None
    clip: float | None = None
    accountant: Literal["prv", "rdp"] | None = None
    noise: Literal["central", "distributed"] | None = None
    privacy_unit: Literal["user", "interaction"] = "user"
    example_clip: float | None = None
    replay: bool = False
    secagg: bool = False
    secagg_neighbours: int | None = None
    secagg_dropout: float = 0.05
    secagg_corrupt: float = 0.05
    secagg_scale_bits: int = 16
    secagg_simulate_dropout: float = 0.0
    secagg_mode: Literal["semi-honest", "malicious"] = "semi-honest"
    prior_share: float | None = None
    prior_items: int = 20
    prior_weight: float | None = None
    prior_weighting: Literal["sqrt", "capped", "sample"] = "capped"

    def __post_init__(self) -> None:
        check_field_types(self)  # the comparisons below assume numbers
        if self.epsilon is not None and not (self.epsilon > 0):
            raise ConfigError(f"epsilon must be > 0, got {self.epsilon!r}")
        if self.noise_multiplier is not None and not (
            self.noise_multiplier == 0 or MIN_NOISE_MULTIPLIER <= self.noise_multiplier < math.inf
        ):
            raise ConfigError(
                f"noise multiplier must be 0 or a finite number >= 2**-500 (a smaller one "
                f"underflows in the accountant), got {self.noise_multiplier!r}"
            )
        if not 0 < self.delta < 1:
            raise ConfigError(f"delta must be in (0, 1), got {self.delta!r}")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip > 0):
            raise ConfigError(f"clip must be a finite number > 0, got {self.clip!r}")
        if self.accountant not in (None, "prv", "rdp"):
            raise ConfigError(f"accountant must be prv or rdp, got {self.accountant!r}")
        if self.noise not in (None, "central", "distributed"):
            raise ConfigError(f"noise must be central or distributed, got {self.noise!r}")
        if self.noise == "distributed" and self.accountant == "prv":
            raise ConfigError(
                "--noise distributed is accounted with RDP (the distributed discrete Gaussian's "
                "guarantee is an RDP bound); drop --accountant prv or give --accountant rdp"
            )
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
        if self.clip is not None and not self.dp and not self.secagg:
            raise ConfigError(
                "--clip bounds the updates that DP noises (or each input of --secagg), and this "
                "run has neither; add --epsilon or --noise-multiplier, or drop --clip"
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
        if not isinstance(self.replay, bool):
            raise ConfigError(f"replay must be true or false, got {self.replay!r}")
        if self.replay and not self.dp:
            raise ConfigError(
                "--replay-from-seed derives DP noise and cohorts from --seed, but this run has "
                "no DP (no --epsilon or --noise-multiplier) and is seeded already; drop it"
            )
        if self.secagg_mode not in ("semi-honest", "malicious"):
            raise ConfigError(
                f"secagg mode must be semi-honest or malicious, got {self.secagg_mode!r}"
            )
        if self.secagg_mode == "malicious" and not self.secagg:
            raise ConfigError(
                "secagg_mode = 'malicious' hardens secure aggregation against an active server; "
                "turn secure aggregation on (--secagg, privacy.secagg = true)"
            )
        if not 0 <= self.secagg_corrupt < 1:
            raise ConfigError(
                f"secagg corrupt fraction must be in [0, 1), got {self.secagg_corrupt!r}"
            )
        if self.ring_noise and self.secagg_dropout + self.secagg_corrupt >= 1:
            raise ConfigError(
                f"secagg_dropout {self.secagg_dropout!r} plus secagg_corrupt "
                f"{self.secagg_corrupt!r} leaves no honest survivor's noise share in the sum; "
                "lower one of them in [privacy] so that their sum is below 1"
            )
        if self.ring_noise and self.secagg_corrupt > 0 and self.secagg_dropout < 1e-4:
            # Shares sized for (1 - f - g) m honest ones need ceil((1 - f - g) m) + ceil(g m)
            # survivors: more than m for some m below 1 / f, and for most m when f is 0.
            raise ConfigError(
                f"secagg_dropout {self.secagg_dropout!r} with secagg_corrupt "
                f"{self.secagg_corrupt!r} leaves cohorts of up to 1 / secagg_dropout clients one "
                "survivor short of the honest noise shares; set secagg_dropout to at least "
                "1e-4 (the default is 0.05) or secagg_corrupt to 0 in [privacy]"
            )
        self._check_prior()

    def _check_prior(self) -> None:
        """The private popularity prior (:mod:`securefed.prior`): a share of a user-level
        ``epsilon`` with central (or continuous distributed) Gaussian noise."""
        k = self.prior_items
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"prior items must be a positive integer, got {k!r}")
        if self.prior_weighting not in ("sqrt", "capped", "sample"):
            raise ConfigError(
                f"prior weighting must be sqrt, capped or sample, got {self.prior_weighting!r}"
            )
        w = self.prior_weight
        if w is not None and not (
            isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w) and w >= 0
        ):
            raise ConfigError(f"prior weight must be a finite number >= 0, got {w!r}")
        share = self.prior_share
        if share is None:
            return
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1:
            raise ConfigError(
                f"--private-prior is the prior's share of the budget, in (0, 1), got {share!r}"
            )
        if self.epsilon is None or self.noise_multiplier is not None:
            raise ConfigError(
                "--private-prior splits a target --epsilon between the popularity prior and "
                "the model; give --epsilon and no --noise-multiplier"
            )
        if self.privacy_unit != "user":
            raise ConfigError("--private-prior is a user-level mode; use --privacy-unit user")
        if self.secagg and self.noise != "central":
            raise ConfigError(
                "--private-prior with --secagg releases the prior with central noise; give "
                "--noise central (distributed discrete noise cannot share its ledger yet)"
            )

    @property
    def dp(self) -> bool:
        """Whether differential privacy is on."""
        return self.epsilon is not None or self.noise_multiplier is not None

    @property
    def os_randomness(self) -> bool:
        """Whether DP noise, cohorts and the secure-aggregation public seed come from the OS
        (every DP run unless ``replay``; a run without DP has nothing to hide and is seeded)."""
        return self.dp and not self.replay

    @property
    def interaction_dp(self) -> bool:
        """Whether the clients run interaction-level DP-SGD (``--privacy-unit interaction``)."""
        return self.dp and self.privacy_unit == "interaction"

    @property
    def placement(self) -> Literal["central", "distributed"]:
        """Where user-level DP noise is added: ``--noise``, or inside secure aggregation
        (distributed) when it is on and centrally otherwise."""
        return self.noise or ("distributed" if self.secagg else "central")

    @property
    def user_accountant(self) -> Literal["prv", "rdp"]:
        """The accountant of user-level DP: ``--accountant``, else RDP for distributed noise
        (its guarantee is an RDP bound) and PRV for central noise. The aggregator accounts
        with it and the private prior's scores read their noise level with it."""
        return self.accountant or ("rdp" if self.placement == "distributed" else "prv")

    @property
    def ring_noise(self) -> bool:
        """Whether user-level DP noise is drawn as distributed discrete-Gaussian shares inside
        the secure-aggregation ring (each client rounds its whole vector first)."""
        return (
            self.dp and not self.interaction_dp and self.secagg and self.placement == "distributed"
        )


@dataclass(frozen=True, kw_only=True)
class TrainConfig(KeywordSettings):
    """Everything a run needs; written to ``config.toml`` fully resolved.

    ``rounds``, the cohort and ``params`` default per model (its registry entry): FedRAP trains
    every client for 100 rounds, FedRecGEL a uniform 10% each round, MostPop counts once.

    Attributes:
        model: A registered model name (``securefed.models.registry.model_names()``).
        params: The model's hyperparameters (its ``ModelSpec.params`` type); defaults when None.
        min_interactions: Users with fewer interactions are dropped (same for every model).
        synthetic_users: Users of the built-in synthetic dataset. 3,000 by default: at
            MovieLens 100K's 943 users no private model here beats a private popularity count
            at epsilon 2 on the synthetic data in full ranking; from about 2,000 users the
            private fedals does (README, docs/privacy.md).
        keep_private_state: Keep the resume checkpoint, every client's private state
            included, once the run has finished. By default a finished run keeps only what
            a user reads: its config, metrics, summary, ledger and the released model
            (``model.pt``); the checkpoint (for FedRAP on MovieLens 100K about 203 MB of
            private item views) is removed. Needed only to continue a finished run with
            more rounds (edit ``rounds`` in its ``config.toml`` and resume it).
        select_on: The metric that selects the reported round on validation: ``"sampled"``
            HR@10 (then NDCG@10) among 99 sampled negatives, the papers' protocol, or
            ``"full"``-ranking HR@10 (every evaluated round is then ranked in full); or
            ``"last"``: no selection, the last evaluated round is reported. None: sampled,
            unless the model settles it on the data (fedals's private mode: the last round,
            its rounds adding releases to one model; docs/privacy.md, "The last round, not the
            best on validation").
        eval_users: Rank only a fixed, seeded sample of this many users in full (every user
            still gets the sampled protocol): full ranking costs users x items, too much on a
            large population for some models. The full-ranking metrics are then estimates of
            the all-user means, with 95 % confidence intervals (``*_ci95`` in the metrics and
            summary); the baselines are ranked on the same users. None: every user.
        eval_negatives: Negatives the sampled evaluation ranks each held-out item against
            (``leave_one_out(n_eval_negatives=...)``): 99, the papers' protocol, by default;
            at least 10 (with fewer, the sampled HR@10 is 1 whatever the model). A catalogue
            where some user has fewer than 99 items left to draw from needs fewer. Results
            are comparable only at one value; the run's summary says which where not 99.
        columns: The header's names for the roles of a table of your own
            (``{"user": "customer_id", "item": "product_sku"}``, ``[columns]`` in
            ``config.toml``, ``--columns user=customer_id,item=product_sku``): ``user``,
            ``item`` and ``timestamp`` (:func:`securefed.data.loaders.check_columns`); a
            role left out is read from the column named after it. None: every role from its
            own name. Refused for the built-in datasets.
    """

    settings_hint: ClassVar[str] = (
        " (a model's own settings go in params=, e.g. params=FedRAPConfig(...); "
        "securefed.get_spec(model).params is the model's type)"
    )

    model: str = DEFAULT_MODEL
    dataset: str = "synthetic"
    data_dir: str | None = None
    columns: dict[str, str] | None = None
    rounds: int = None  # type: ignore[assignment]  # resolved from the model's default
    seed: int = 0
    client_fraction: float | None = None
    clients_per_round: int | None = None
    device: str = "cpu"
    eval_every: int = 1
    full_eval_every: int | None = None
    checkpoint_every: int | None = None
    keep_private_state: bool = False
    select_on: str | None = None
    eval_users: int | None = None
    eval_negatives: int = 99  # securefed.data.split.DEFAULT_EVAL_NEGATIVES
    min_interactions: int = DEFAULT_MIN_INTERACTIONS
    synthetic_users: int = 3000
    synthetic_items: int = 1682
    params: Any = None
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    def __post_init__(self) -> None:
        check_field_types(self)  # the comparisons below assume numbers
        if not isinstance(self.privacy, PrivacyConfig):
            raise ConfigError(
                f"privacy must be a PrivacyConfig, got {type(self.privacy).__name__}; build "
                "it with PrivacyConfig(...)"
            )
        spec = get_spec(self.model)
        object.__setattr__(self, "params", spec.check_params(self.params))
        if spec.resolve_params is not None:
            object.__setattr__(self, "params", spec.resolve_params(self.params, self.privacy))
        if self.rounds is None:
            object.__setattr__(self, "rounds", spec.rounds_for(self.privacy))
        for name in (
            "rounds",
            "eval_every",
            "checkpoint_every",
            "synthetic_users",
            "synthetic_items",
        ):
            value = getattr(self, name)
            if value is None and name == "checkpoint_every":
                continue  # resolved where the run happens (resolved_checkpoint_every)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"{name.replace('_', ' ')} must be a positive integer, got {value!r}"
                )
        if self.select_on not in (None, "sampled", "full", "last"):
            raise ConfigError(f"select on must be sampled, full or last, got {self.select_on!r}")
        if not isinstance(self.keep_private_state, bool):
            raise ConfigError(
                f"keep private state must be true or false, got {self.keep_private_state!r}"
            )
        if self.full_eval_every is not None and (
            not isinstance(self.full_eval_every, int) or self.full_eval_every < 1
        ):
            raise ConfigError(
                f"full eval every must be a positive integer, got {self.full_eval_every!r}"
            )
        if self.eval_users is not None and (
            not isinstance(self.eval_users, int)
            or isinstance(self.eval_users, bool)
            or self.eval_users < 2
        ):
            raise ConfigError(
                f"eval users must be an integer >= 2 (users ranked in full), got "
                f"{self.eval_users!r}"
            )
        self._check_data()
        if not 0 <= self.seed < 2**128:  # protocols.seeding hashes the root seed as 16 bytes
            raise ConfigError(f"seed must be an integer in [0, 2**128), got {self.seed!r}")
        if self.client_fraction is not None and self.clients_per_round is not None:
            raise ConfigError("give either --client-fraction or --clients-per-round, not both")
        if self.client_fraction is not None and not 0 < self.client_fraction <= 1:
            raise ConfigError(f"client fraction must be in (0, 1], got {self.client_fraction!r}")
        if self.clients_per_round is not None and self.clients_per_round < 1:
            raise ConfigError(
                f"clients per round must be a positive integer, got {self.clients_per_round!r}"
            )
        if (
            isinstance(self.min_interactions, bool)
            or not isinstance(self.min_interactions, int)
            or self.min_interactions < 3
        ):
            raise ConfigError(
                "min interactions must be an integer >= 3 (leave-one-out needs them), "
                f"got {self.min_interactions!r}"
            )
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be cpu or cuda, got {self.device!r}")
        self._check_defenses(spec)

    def _check_data(self) -> None:
        """``eval_negatives`` and ``columns`` (the latter normalised: roles in order, an
        empty mapping None)."""
        from securefed.data.split import MIN_EVAL_NEGATIVES

        n = self.eval_negatives
        if isinstance(n, bool) or not isinstance(n, int) or n < MIN_EVAL_NEGATIVES:
            raise ConfigError(
                f"eval negatives must be an integer >= {MIN_EVAL_NEGATIVES} (with fewer, every "
                f"held-out item is in the sampled top 10: HR@10 would be 1 whatever the "
                f"model), got {n!r}"
            )
        if self.columns is None:
            return
        from securefed.data.loaders import check_columns
        from securefed.data.registry import KNOWN_DATASETS, refuse_columns_for

        columns = check_columns(self.columns) or None
        object.__setattr__(self, "columns", columns)
        if columns and self.dataset in KNOWN_DATASETS:
            raise ConfigError(refuse_columns_for(self.dataset))

    def _check_defenses(self, spec: Any) -> None:
        p = self.privacy
        if not spec.federated and (p.dp or p.secagg):
            raise ConfigError(
                f"{spec.name} is a CENTRALIZED reference (the server sees every interaction); "
                "it has no federated protocol to protect, so --epsilon, --noise-multiplier and "
                "--secagg do not apply; use a federated model (e.g. --model fedals) for those"
            )
        if not spec.federated and (
            self.client_fraction is not None or self.clients_per_round is not None
        ):
            raise ConfigError(
                f"{spec.name} is a centralized reference with no clients to sample; drop "
                "--client-fraction/--clients-per-round"
            )
        if p.interaction_dp and not spec.interaction_dp:
            raise ConfigError(
                f"{spec.name} has no interaction-level DP-SGD; use --privacy-unit user"
            )
        if p.dp and not p.interaction_dp and not spec.user_dp:
            raise ConfigError(f"{spec.name} does not support user-level DP")
        if p.prior_share is not None and spec.prior_weight is None:
            raise ConfigError(
                f"{spec.name} has no popularity-prior mode (models with one: "
                f"{', '.join(n for n in model_names() if get_spec(n).prior_weight is not None)}); "
                "drop --private-prior"
            )

    @property
    def spec(self) -> Any:
        """The model's registry entry (:class:`~securefed.models.registry.ModelSpec`)."""
        return get_spec(self.model)

    def cohort(self, n_users: int) -> CohortSpec:
        """The cohort sampling of this run (flags first, else the model's paper default).

        Under user-level DP a cohort is Poisson or everyone: a fixed-size cohort cannot be
        accounted as full participation (adding a user can push another out of it, which
        moves the round's sum by up to two clips), so ``clients_per_round`` is refused there
        and a model's fixed-size default (FedRecGEL's 10 %) becomes Poisson sampling at the
        same expected size, accounted with amplification (docs/privacy.md, "Fixed-size
        cohorts")."""
        user_dp = self.privacy.dp and not self.privacy.interaction_dp
        if self.client_fraction is not None:
            if self.client_fraction == 1.0:
                return CohortSpec(kind="all")
            return CohortSpec(kind="poisson", fraction=self.client_fraction)
        if self.clients_per_round is not None:
            if user_dp:
                raise ConfigError(
                    f"--clients-per-round {self.clients_per_round} (a fixed-size cohort) is not "
                    "accounted exactly under user-level DP: adding a user can push another out "
                    "of it; use --client-fraction "
                    f"{min(1.0, self.clients_per_round / max(n_users, 1)):.3g} (Poisson cohorts "
                    "of that expected size, accounted with amplification) or leave both out"
                )
            return CohortSpec(kind="fixed", size=self.clients_per_round)
        default = self.spec.cohort(n_users)
        if default is not None and default.kind == "fixed" and user_dp:
            fraction = min(1.0, default.size / max(n_users, 1))
            return (
                CohortSpec(kind="all")
                if fraction >= 1.0
                else CohortSpec(kind="poisson", fraction=fraction)
            )
        return default if default is not None else CohortSpec(kind="all")

    def resolved_checkpoint_every(self, *, flower: bool = False) -> int:
        """The checkpoint cadence unless given: every :data:`DEFAULT_CHECKPOINT_EVERY` rounds
        in process, every :data:`FLOWER_CHECKPOINT_EVERY` on Flower (``flower``), where a
        node's snapshot is a hard link to the state file it writes after each training anyway
        and a stop otherwise re-runs, and counts again, the rounds since the last checkpoint
        (found in a deployment walkthrough: a 4-round run stopped after round 2 resumed from
        round 0, spent its budget on the re-runs and released a 1-round model)."""
        if self.checkpoint_every is not None:
            return self.checkpoint_every
        return FLOWER_CHECKPOINT_EVERY if flower else DEFAULT_CHECKPOINT_EVERY

    def resolved_full_eval_every(self) -> int:
        """The model's full-ranking cadence unless given (every round for dot-product models;
        every 10 rounds for FedRecGEL, whose MLP scorer makes users x items scoring costly).
        The selected round is always given full-ranking metrics (from a saved copy).
        Selecting on the full ranking (``select_on = "full"``) ranks every evaluated round."""
        if self.select_on == "full":
            return 1
        if self.full_eval_every is not None:
            return self.full_eval_every
        return int(self.spec.full_eval_every)

    def resolved_min_interactions(self) -> int:
        """The fewest interactions a user needs to be kept (``min_interactions``: every model
        drops the same users), as :func:`securefed.training.load_split` filters with and
        ``data.json`` records."""
        return self.min_interactions

    def to_dict(self) -> dict[str, Any]:
        """A TOML-ready mapping: scalars at the top, one table per sub-config; the model's
        hyperparameters are the table named after the model."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "params":
                out[self.model] = dataclasses.asdict(value)
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                out[f.name] = dataclasses.asdict(value)
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TrainConfig:
        """Build a config from a mapping (e.g. a TOML file); unknown keys are errors.

        The table named after the chosen model holds its hyperparameters; tables named after
        other registered models are checked and ignored here (run directories written before
        the registry hold a ``[fedrap]`` and a ``[fedrecgel]`` table, and still load). A
        config file a user gives for a new run is refused with one first
        (:func:`refuse_other_model_tables`).

        Raises:
            ConfigError: ``raw`` is not a mapping, or a key, table or value is not a valid
                setting (one line naming it).
        """
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"TrainConfig.from_dict takes a mapping of settings (a dict, as "
                f"load_config_file reads a TOML file), got {type(raw).__name__}"
            )
        model = raw.get("model", DEFAULT_MODEL)
        if not isinstance(model, str):
            raise ConfigError(f"model must be a string, got {model!r}")
        get_spec(model)  # an unknown model is an error before anything else
        names = set(model_names())
        kwargs: dict[str, Any] = {}
        known = {f.name for f in dataclasses.fields(cls)} - {"params"}
        for key, value in raw.items():
            if key in names:
                if not isinstance(value, Mapping):
                    raise ConfigError(f"config section [{key}] must be a table")
                # Another model's table is checked (a typo is still an error) but not used.
                parsed = get_spec(key).params_from_mapping(value, section=key)
                if key == model:
                    kwargs["params"] = parsed
                continue
            if key not in known:
                raise ConfigError(
                    f"unknown config key {key!r}; known keys: {', '.join(sorted(known | {model}))}"
                )
            if key == "privacy":
                if not isinstance(value, Mapping):
                    raise ConfigError("config section [privacy] must be a table")
                kwargs[key] = dataclass_from_table(
                    PrivacyConfig, legacy_privacy_keys(value), section=key
                )
            else:
                kwargs[key] = value
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"invalid config: {exc}") from None


def legacy_privacy_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """Translate the ``secure`` key of configs written before OS randomness was the default.

    ``secure = false`` was recorded in every run directory's ``config.toml`` and meant "derive
    the DP noise from the seed": for a DP run it is ``replay = true`` (so old run directories
    resume and re-simulate as they ran, labelled as replay runs). ``secure = true`` is today's
    default and is dropped. Given together with ``replay`` the two must agree.
    """
    out = dict(values)
    if "secure" not in out:
        return out
    secure = out.pop("secure")
    if not isinstance(secure, bool):
        raise ConfigError(f"secure must be true or false, got {secure!r}")
    dp = out.get("epsilon") is not None or out.get("noise_multiplier") is not None
    legacy_replay = dp and not secure
    if dp and "replay" in out and out["replay"] is not legacy_replay:
        raise ConfigError(
            f"[privacy] gives secure = {str(secure).lower()} and replay = "
            f"{str(out['replay']).lower()}, which contradict each other; drop secure (OS "
            "randomness is the default now; replay = true derives it from the seed)"
        )
    if legacy_replay:
        out["replay"] = True
    return out


def refuse_legacy_secure(raw: Mapping[str, Any], source: str | Path) -> None:
    """Refuse ``[privacy] secure = false`` in a config a user gives for a *new* run.

    :func:`legacy_privacy_keys` reads it as ``replay = true`` so that old run directories
    resume as they ran; a new run asking for seeded DP noise that way would get it silently
    (``train`` refused it already; ``flower local``/``simulate``/``app`` and the ServerApp's
    ``config-file`` did not until 2026-12-06, found in review)."""
    privacy = raw.get("privacy", {})
    if isinstance(privacy, Mapping) and privacy.get("secure") is False:
        raise ConfigError(
            f"[privacy] secure = false in {source} asked for DP noise derived from the "
            "seed; that is now replay = true (experiments only), and OS randomness is "
            "the default: write replay = true or delete the key"
        )


def refuse_other_model_tables(raw: Mapping[str, Any], source: str | Path) -> None:
    """Refuse a table of another model than the one ``raw`` trains in a config a user gives
    for a *new* run: :meth:`TrainConfig.from_dict` ignores it (so that run directories
    written before the registry, which hold a table per model, still resume), and a new run
    would go ahead with settings its user wrote silently unused (found in a walkthrough:
    ``model = "fedrap"`` with a ``[fedals]`` table trained FedRAP with defaults)."""
    model = raw.get("model", DEFAULT_MODEL)
    for key in raw:
        if key != model and key in model_names():
            raise ConfigError(
                f"[{key}] in {source} sets {key}'s settings, but this run trains {model}, "
                f"which would ignore them; delete the [{key}] table or train {key} "
                f'(model = "{key}" or --model {key})'
            )


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a mapping, with a clear error for a bad file."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except IsADirectoryError:
        raise ConfigError(f"{p} is a folder, not a config file; give a .toml file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not UTF-8 text; give a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None


__all__ = [
    "DEFAULT_MIN_INTERACTIONS",
    "MIN_NOISE_MULTIPLIER",
    "PrivacyConfig",
    "TrainConfig",
    "legacy_privacy_keys",
    "refuse_legacy_secure",
    "refuse_other_model_tables",
    "load_config_file",
    "with_private_mode",
]


def with_private_mode(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` (a :meth:`TrainConfig.from_dict` mapping, as ``config.toml`` holds it) with its
    model's private mode (:class:`~securefed.models.registry.PrivateMode`: rounds, Poisson
    cohort rate and prior share) wherever ``raw`` does not set them; ``securefed train
    --private-mode`` is this over the flags and the config file.

    Raises:
        ConfigError: One line: the model has no such mode (a model whose private mode is on
            with every user-level ``epsilon`` needs none), the run cannot take it (no target
            epsilon, interaction-level DP, distributed noise), it would change nothing, or
            ``raw`` (or its ``privacy`` table) is not a mapping.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"with_private_mode takes a mapping of settings (as TrainConfig.from_dict), got "
            f"{type(raw).__name__}"
        )
    out = dict(raw)
    name = out.get("model", DEFAULT_MODEL)
    if not isinstance(name, str):
        raise ConfigError(f"model must be a string, got {name!r}")
    if not isinstance(out.get("privacy", {}), Mapping):
        raise ConfigError("config section [privacy] must be a table")
    spec = get_spec(name)
    mode = spec.private_mode
    if mode is None:
        if (
            spec.federated
            and spec.user_dp
            and "private" in {f.name for f in dataclasses.fields(spec.params)}
        ):  # a model whose private mode its settings switch on under DP (fedals); ials
            # shares fedals's settings but is a centralized reference (found in review)
            raise ConfigError(
                f"{name}'s private mode needs no flag: it is on for every user-level run with "
                "--epsilon; drop --private-mode"
            )
        with_mode = [n for n in model_names() if get_spec(n).private_mode is not None]
        raise ConfigError(
            f"--private-mode: {name} has none (models with one: {', '.join(with_mode)}); drop "
            "--private-mode"
        )
    privacy = dict(out.get("privacy", {}))
    if (refused := mode.refusal(privacy)) is not None:
        raise ConfigError(refused)
    fields, privacy_fields = mode.config_fields()
    filled = 0
    for key, value in fields.items():
        if key == "client_fraction" and out.get("clients_per_round") is not None:
            continue  # a cohort size given: it sets the cohort
        if out.get(key) is None:
            out[key] = value
            filled += 1
    for key, value in privacy_fields.items():
        if privacy.get(key) is None:
            privacy[key] = value
            filled += 1
    if not filled:
        raise ConfigError(
            "--private-mode would change nothing: its rounds, cohort and prior share are all "
            "given; drop --private-mode"
        )
    out["privacy"] = privacy
    return out
