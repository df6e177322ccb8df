"""Differential privacy for federated client updates.

User-level DP-FedAvg (McMahan et al. ICLR 2018): clip each participant's flat update to L2
norm C, add Gaussian noise of std ``sigma * C`` to the sum (centrally, or as distributed
discrete Gaussian shares inside secure aggregation, Kairouz et al. ICML 2021), record one
:class:`PrivacyEvent` per release and account the ledger with Opacus's PRV or RDP accountant.
"""

from protocols.dp.accounting import (
    INTEGER_ORDERS,
    calibrate_noise_multiplier,
    check_delta,
    compute_epsilon,
    ddg_rdp,
    ddg_tau,
    poisson_subsampled_rdp,
    rdp_to_epsilon,
)
from protocols.dp.clipping import clip_rows, clip_scales, clipped_count, clipped_rows
from protocols.dp.config import DPConfig, interaction_sample_rate, privacy_summary
from protocols.dp.ledger import PrivacyEvent, PrivacyLedger
from protocols.dp.mechanisms import (
    CentralGaussian,
    DistributedDiscreteGaussian,
    DistributedGaussian,
    DistributedNoisePlan,
    calibrate_distributed_noise_multiplier,
    conditional_randomized_round,
    distributed_epsilon,
    distributed_noise_plan,
    rounded_l2_bound,
)
from protocols.dp.noise import discrete_gaussian, gaussian_noise

__all__ = [
    "INTEGER_ORDERS",
    "CentralGaussian",
    "DPConfig",
    "DistributedDiscreteGaussian",
    "DistributedGaussian",
    "DistributedNoisePlan",
    "PrivacyEvent",
    "PrivacyLedger",
    "calibrate_distributed_noise_multiplier",
    "calibrate_noise_multiplier",
    "check_delta",
    "clip_rows",
    "clip_scales",
    "clipped_count",
    "clipped_rows",
    "compute_epsilon",
    "conditional_randomized_round",
    "ddg_rdp",
    "ddg_tau",
    "discrete_gaussian",
    "distributed_epsilon",
    "distributed_noise_plan",
    "gaussian_noise",
    "interaction_sample_rate",
    "poisson_subsampled_rdp",
    "privacy_summary",
    "rdp_to_epsilon",
    "rounded_l2_bound",
]
