"""Threat models and what each observer really sees under a run's defenses.

Three observers (every attack result names one):

* ``UPLOAD_OBSERVER`` -- an honest-but-curious server without secure aggregation. It sees
  every participant's upload every round, *as it leaves the client*: the raw update without
  DP or with central DP (a trusted-server model: central DP protects only what the server
  releases), the clipped update plus the client's own noise share with distributed noise,
  and nothing per client under secure aggregation.
* ``AGGREGATE_OBSERVER`` -- a server behind secure aggregation (or anyone who sees the
  round's aggregate): it sees the per-round sum of the (clipped, noised) uploads and the
  public global model of every round.
* ``RELEASE_OBSERVER`` -- anyone who sees the released global model after training.

Every attacker knows the training recipe (model, hyperparameters, number of negatives) and
the public global model of each round, never a client's private parameters (FedRAP's
``D_u`` and scorer, FedRecGEL's user embeddings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import torch

from protocols.dp import DistributedGaussian, clip_scales, gaussian_noise
from securefed.errors import ConfigError

if TYPE_CHECKING:
    from securefed.config import TrainConfig
    from securefed.data.types import Split
    from securefed.federation.base import ClientUpdates

__all__ = ["ThreatModel", "UploadChannel", "upload_channel", "sum_noise_std"]


class ThreatModel(StrEnum):
    """Who observes what (see the module docstring)."""

    UPLOAD_OBSERVER = "upload-observer"
    AGGREGATE_OBSERVER = "aggregate-observer"
    RELEASE_OBSERVER = "release-observer"

    def describe(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    ThreatModel.UPLOAD_OBSERVER: (
        "honest-but-curious server without secure aggregation: sees each participant's "
        "upload every round as it leaves the client, and the public global model"
    ),
    ThreatModel.AGGREGATE_OBSERVER: (
        "server behind secure aggregation: sees only each round's sum of uploads and the "
        "public global models"
    ),
    ThreatModel.RELEASE_OBSERVER: "anyone who sees the released global model after training",
}


@dataclass(frozen=True)
class UploadChannel:
    """What one client's upload looks like to the upload observer.

    Attributes:
        clip: L2 clip applied on the device before upload (None: raw update).
        share_std: Std of the client's own Gaussian noise share (0: none).
        note: Why the observer sees this (written into the results).
    """

    clip: float | None
    share_std: float
    note: str

    def observe(
        self,
        updates: ClientUpdates,
        rows: torch.Tensor,
        norms: torch.Tensor,
        *,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """The observed flat uploads of ``rows`` (positions in ``updates.clients``), ``[r, d]``.

        The noise share is drawn with the aggregator's mechanism and std
        (:func:`protocols.dp.gaussian_noise`, as :class:`~protocols.dp.DistributedGaussian`
        draws it) from the observer's own generator: the
        same distribution as the share the client really sent, not the same sample.
        """
        x = updates.dense(rows)
        if self.clip is not None:
            factors = clip_scales(norms[rows], self.clip)
            x = x * factors.to(x.dtype).unsqueeze(1)
        if self.share_std > 0:
            x = x + gaussian_noise(tuple(x.shape), self.share_std, generator=generator)
        return x


def _aggregator(config: TrainConfig, split: Split) -> Any:
    """The run's aggregator, rebuilt on ``split`` for its public parameters; a model without
    an upload layout has none to rebuild (:func:`securefed.costs.layout_size` would say 0)."""
    from securefed.costs import layout_size
    from securefed.privacy import PrivateAggregator

    if config.spec.layout_size is None:
        raise ConfigError(f"{config.model} has no upload layout")
    return PrivateAggregator(config, split, dim=layout_size(config, split))


def privacy_parameters(config: TrainConfig, split: Split) -> dict[str, Any]:
    """Clip, noise multiplier and placement the run's aggregator uses (recomputed, public)."""
    p = config.privacy
    if not p.dp and not p.secagg:
        return {"clip": None, "noise_multiplier": 0.0, "placement": None, "cohort": None}
    agg = _aggregator(config, split)
    placement = agg.dp.placement if agg.dp is not None else None
    return {
        "clip": float(agg.clip),
        "noise_multiplier": float(agg.noise_multiplier or 0.0),
        "placement": placement,
        "cohort": agg.expected_cohort,
    }


def upload_channel(
    config: TrainConfig,
    split: Split,
    *,
    cohort_size: int,
    params: dict[str, Any] | None = None,
) -> UploadChannel:
    """The upload observer's view under the run's defenses.

    ``params`` are :func:`privacy_parameters` when the caller has them (calibrating the
    noise multiplier again costs seconds).

    Raises:
        ConfigError: Secure aggregation is on: no per-client upload is visible, and the
            audit refuses to fabricate one.
    """
    p = config.privacy
    if p.secagg:
        raise ConfigError(
            "secure aggregation is on: an honest-but-curious server sees no per-client upload, "
            "only per-round sums, so per-client attacks have no input; choose the "
            "aggregate-observer attacks (union, differencing) or a run without --secagg"
        )
    if not p.dp:
        return UploadChannel(
            clip=None, share_std=0.0, note="raw uploads (no DP, no secure aggregation)"
        )
    if p.interaction_dp:
        return UploadChannel(
            clip=None,
            share_std=0.0,
            note=(
                "each upload is the output of the client's own DP-SGD (per-example clipping "
                "and Gaussian noise on every local step), observed exactly as it was sent"
            ),
        )
    params = params if params is not None else privacy_parameters(config, split)
    if params["placement"] == "distributed":
        mech = DistributedGaussian(
            clip=params["clip"],
            noise_multiplier=params["noise_multiplier"],
            min_survivors=max(int(cohort_size), 1),
        )
        return UploadChannel(
            clip=params["clip"],
            share_std=mech.share_std,
            note=(
                "clipped upload plus the client's Gaussian noise share "
                f"(std sigma*C/sqrt(m) = {mech.share_std:.4g}); the share is redrawn from the "
                "same mechanism and std, not the client's own sample"
            ),
        )
    return UploadChannel(
        clip=None,
        share_std=0.0,
        note=(
            "central DP trusts the server: it sees raw uploads and the DP noise protects only "
            "the released aggregates and model (audited under the aggregate observer)"
        ),
    )


def sum_noise_std(params: dict[str, Any]) -> float:
    """Std of the DP noise on one round's released sum (``sigma * C``; 0 without DP)."""
    if not params["noise_multiplier"]:
        return 0.0
    return float(params["noise_multiplier"]) * float(params["clip"])


def clip_bound(params: dict[str, Any]) -> float | None:
    """The per-client clip the aggregator applies before summing (None: no clipping)."""
    clip = params["clip"]
    return None if clip is None or math.isinf(clip) else float(clip)
