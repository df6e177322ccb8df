"""Client-side DP-SGD for interaction-level privacy: per-example norms, clipping, accounting.

Unit of privacy: one (user, item) interaction of a client's local training set (Abadi et al.,
"Deep Learning with Differential Privacy", CCS 2016, Algorithm 1). Each client runs DP-SGD on
its own interactions: every local step clips each example's gradient over *all* parameters the
example touches to L2 norm ``example_clip`` and adds ``N(0, sigma^2 example_clip^2)`` to every
coordinate that any neighbouring example could touch.

Per-example gradient norms are computed in closed form, never by materialising an
``[examples x parameters]`` matrix (the "ghost norm" idea of Goodfellow 2015 and Li et al.,
"Large Language Models Can Be Strong Differentially Private Learners", ICLR 2022):

* an embedding table whose gradient row for sample ``s`` is ``coef_s * v_e`` (one vector
  ``v_e`` per example ``e``, e.g. the scorer weights) has per-example squared norm
  ``||v_e||^2 * sum_rows (sum_{s -> row} coef_s)^2`` (:func:`embedding_example_sq_norms`);
* a linear layer with one output, input ``x_s`` and output gradient ``delta_s`` has per-example
  gradient ``sum_s delta_s x_s`` (``[examples, in]``, the size of one layer per example), whose
  norm for a single sample is ``||x||^2 * delta^2`` (:func:`linear_example_grads`).

* a linear layer with any output width and ``k`` samples per example has per-example squared
  norm ``sum_{s,t} <delta_s, delta_t> <x_s, x_t>`` plus the bias term
  (:func:`linear_ghost_sq_norms`), and an embedding table with a different gradient row per
  sample ``sum_{s,t} [row_s = row_t] <g_s, g_t>`` (:func:`embedding_rows_sq_norms`): only
  ``[E, k, k]`` Gram matrices (FedRecGEL's NCF).

Every example has the same number ``k`` of samples (a positive and its negatives).

Accounting (:func:`dpsgd_steps`): within an epoch the local batches partition the client's
examples, so one interaction enters exactly one Gaussian step per epoch; a run is
``local_epochs * rounds`` compositions of the Gaussian mechanism with sample rate 1 (no
amplification is claimed for shuffling or for client sampling). FedRecGEL's SAM step reads the data
in up to three passes, each a release (:func:`sam_releases`), so its run is ``releases *
rounds`` compositions.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import torch

from protocols.dp.accounting import (
    calibrate_noise_multiplier,
    check_accountant,
    check_delta,
    check_noise_multiplier,
    compute_epsilon,
)
from protocols.dp.clipping import clip_scales
from protocols.dp.ledger import PrivacyEvent
from protocols.dp.noise import check_std, gaussian_noise
from protocols.errors import ConfigError
from protocols.seeding import torch_generator


@dataclass(frozen=True, kw_only=True)
class DPSGDConfig:
    """What a client's local DP-SGD needs: the noise multiplier, the example clip, the source.

    Attributes:
        noise_multiplier: sigma; each step adds ``N(0, (sigma * example_clip)^2)`` to the sum
            of clipped per-example gradients, on every coordinate.
        example_clip: L2 bound of one example's gradient over all the parameters it touches.
        secure: Draw the noise from the OS (see :func:`protocols.dp.gaussian_noise`).
    """

    noise_multiplier: float
    example_clip: float
    secure: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.noise_multiplier, bool) or not isinstance(
            self.noise_multiplier, numbers.Real
        ):
            raise ConfigError(
                f"noise multiplier must be a number >= 0, got {self.noise_multiplier!r}"
            )
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise ConfigError(
                f"noise multiplier must be a finite number >= 0, got {self.noise_multiplier!r}"
            )
        check_example_clip(self.example_clip)
        if not isinstance(self.secure, bool):
            raise ConfigError(f"secure must be True or False, got {self.secure!r}")

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise added to the sum of clipped example gradients."""
        return float(self.noise_multiplier) * float(self.example_clip)

    def round_generator(self, seed: int, round_index: int) -> torch.Generator | None:
        """The noise generator of one round: ``None`` in secure mode (OS randomness), else
        derived from the run seed (``derive(seed, "dpsgd-noise", round)``)."""
        if self.secure:
            return None
        return torch_generator(seed, "dpsgd-noise", round_index)


def check_example_clip(clip: float) -> float:
    """Return the example clip as float if it is finite and > 0, else raise ConfigError."""
    if isinstance(clip, bool) or not isinstance(clip, numbers.Real):
        raise ConfigError(f"example clip must be a number > 0, got {clip!r}")
    if not (math.isfinite(clip) and clip > 0):
        raise ConfigError(f"example clip must be a finite number > 0, got {clip!r}")
    return float(clip)


def check_interaction_delta(delta: float, *, n_interactions: int) -> float:
    """Refuse ``delta >= 1 / n_interactions`` for interaction-level DP.

    The uploads of all clients together are released, and they depend on every training
    interaction; a mechanism that publishes each interaction in the clear with probability
    delta is (0, delta)-DP, so a delta of ``1/n`` or more over ``n`` interactions admits
    publishing one of them. The bound is over all training interactions, stricter than the
    per-client ``1 / (interactions of the largest client)``.
    """
    d = check_delta(delta)
    if (
        isinstance(n_interactions, bool)
        or not isinstance(n_interactions, int)
        or n_interactions < 1
    ):
        raise ConfigError(f"n_interactions must be a positive integer, got {n_interactions!r}")
    if d >= 1.0 / n_interactions:
        raise ConfigError(
            f"delta must be below 1/interactions = {1.0 / n_interactions:.3g} for "
            f"{n_interactions} training interactions (interaction-level DP), got {delta!r}; "
            f"choose delta <= {0.1 / n_interactions:.1g}"
        )
    return d


def dpsgd_steps(*, local_epochs: int, rounds: int) -> int:
    """Gaussian steps one interaction enters over a run: ``local_epochs * rounds``.

    Each epoch's batches partition the client's examples (one step per epoch for every
    example), and every round is counted whether or not the client was sampled.
    """
    for name, v in (("local epochs", local_epochs), ("rounds", rounds)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name} must be a positive integer, got {v!r}")
    return local_epochs * rounds


@functools.lru_cache(maxsize=64)
def calibrate_dpsgd_noise(*, epsilon: float, delta: float, steps: int, accountant: str) -> float:
    """The smallest sigma (within Opacus's tolerance) with ``steps`` unamplified Gaussian steps
    at most ``epsilon``-DP at ``delta`` (interaction unit; sample rate 1; never overshoots)."""
    return calibrate_noise_multiplier(
        epsilon=epsilon,
        delta=delta,
        sample_rate=1.0,
        steps=steps,
        accountant=check_accountant(accountant),
    )


def dpsgd_epsilon(*, noise_multiplier: float, delta: float, steps: int, accountant: str) -> float:
    """Epsilon of ``steps`` unamplified Gaussian steps with ``noise_multiplier``."""
    return compute_epsilon(
        noise_multiplier=check_noise_multiplier(noise_multiplier),
        sample_rate=1.0,
        steps=steps,
        delta=delta,
        accountant=check_accountant(accountant),
    )


def fill_gaussian_(
    out: torch.Tensor, std: float, *, generator: torch.Generator | None, secure: bool
) -> torch.Tensor:
    """Overwrite ``out`` with i.i.d. ``N(0, std^2)`` noise (in place: no new allocation).

    The same distribution and sources as :func:`protocols.dp.gaussian_noise` (an explicit
    generator, or OS randomness with its floating-point hardening when ``secure``); the
    in-place form lets DP-SGD reuse one buffer per step for its dense noise.
    """
    if secure:
        return out.copy_(
            gaussian_noise(out.shape, std, generator=generator, secure=True, dtype=out.dtype)
        )
    if generator is None:
        raise ConfigError(
            "pass an explicit torch.Generator (derive it with protocols.seeding), "
            "or set secure=True to use OS randomness"
        )
    std = check_std(std, out.dtype)
    if std == 0:
        return out.zero_()
    return out.normal_(0.0, float(std), generator=generator)


def clip_factors(sq_norms: torch.Tensor, clip: float) -> torch.Tensor:
    """``min(1, clip / norm)`` per example from squared norms (float64 in, float32 out).

    Examples at or under the clip keep factor exactly 1; longer ones are scaled to at most
    ``clip`` (shrunk by 2^-20 so that float32 rounding cannot exceed it).
    """
    c = check_example_clip(clip)
    norms = sq_norms.to(torch.float64).clamp_min(0).sqrt()
    if not bool(torch.isfinite(norms).all()):
        raise ConfigError("per-example gradient norms contain NaN or infinity; lower the lr")
    return clip_scales(norms, c)  # the shrink rule of every other clip (protocols.dp.clipping)


def embedding_example_sq_norms(rows: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """``sum_r (sum_{s: rows[e, s] = r} coef[e, s])^2`` for every example ``e`` (float64).

    Multiply by ``||v_e||^2`` to get the squared Frobenius norm of example ``e``'s gradient of
    an embedding table whose sample ``s`` adds ``coef[e, s] * v_e`` to row ``rows[e, s]`` (the
    output gradient is rank one per example, e.g. a dot-product scorer's weights ``v_e``).
    Samples of one example that hit the same row add up before squaring (collisions are
    exact): the sum is ``sum_{s, t} coef_s coef_t [rows_s = rows_t]``, ``O(E k^2)`` work.

    Args:
        rows: int64 ``[E, k]`` table row of every sample of every example.
        coef: ``[E, k]`` scalar output gradient of every sample.
    """
    if rows.shape != coef.shape or rows.ndim != 2:
        raise ConfigError(
            "rows and coef must be [examples, samples] tensors of one shape, got "
            f"{tuple(rows.shape)} and {tuple(coef.shape)}"
        )
    c = coef.to(torch.float64)
    same = rows.unsqueeze(2) == rows.unsqueeze(1)
    return (same * (c.unsqueeze(2) * c.unsqueeze(1))).sum((1, 2))


def linear_example_grads(x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example gradients of a linear layer with one output (weight ``[in]``, bias).

    Sample ``s`` of example ``e`` with input ``x[e, s]`` and output gradient ``delta[e, s]``
    contributes ``delta * x`` to the example's weight gradient and ``delta`` to its bias
    gradient. The result is ``[E, in]`` (one layer per example, not all parameters); for one
    sample per example its squared norm is the ghost norm ``||x||^2 * delta^2``.

    Args:
        x: ``[E, k, in]`` inputs.
        delta: ``[E, k]`` output gradients.

    Returns:
        ``(weight_grads [E, in], bias_grads [E])``.
    """
    if x.ndim != 3 or delta.shape != x.shape[:2]:
        raise ConfigError(
            f"x must be [E, k, in] and delta [E, k], got {tuple(x.shape)} and {tuple(delta.shape)}"
        )
    d = delta.to(x.dtype)
    return torch.bmm(d.unsqueeze(1), x).squeeze(1), d.sum(1)


def embedding_rows_sq_norms(rows: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """Per-example squared norm of an embedding table's gradient with one vector per sample.

    Sample ``s`` of example ``e`` adds ``grads[e, s]`` to row ``rows[e, s]``; samples that hit
    the same row add before squaring, so the norm^2 is
    ``sum_{s, t} [rows_s = rows_t] <grads_s, grads_t>`` (a ``[E, k, k]`` Gram matrix, never
    ``[E, table]``). The rank-one case ``grads[e, s] = coef[e, s] * v_e`` is
    :func:`embedding_example_sq_norms` times ``||v_e||^2``.

    Args:
        rows: int64 ``[E, k]`` table row of every sample.
        grads: ``[E, k, d]`` gradient row of every sample.

    Returns:
        ``[E]`` float64.
    """
    if rows.ndim != 2 or grads.ndim != 3 or grads.shape[:2] != rows.shape:
        raise ConfigError(
            "rows must be [E, k] and grads [E, k, d], got "
            f"{tuple(rows.shape)} and {tuple(grads.shape)}"
        )
    g = grads.to(torch.float64)
    same = rows.unsqueeze(2) == rows.unsqueeze(1)
    return (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))


def linear_ghost_sq_norms(gram_x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Per-example squared norm of a linear layer's weight and bias gradient (ghost norm).

    Example ``e``'s weight gradient is ``sum_s delta_s x_s^T`` over its ``k`` samples, so its
    squared Frobenius norm is ``sum_{s, t} <delta_s, delta_t> <x_s, x_t>`` (Li et al., ICLR
    2022, ghost clipping; for ``k = 1`` it is ``||x||^2 ||delta||^2``), and the bias adds
    ``||sum_s delta_s||^2``. Only ``[E, k, k]`` Gram matrices are formed.

    Args:
        gram_x: ``[E, k, k]`` input inner products ``<x_s, x_t>`` (the caller may assemble
            them from parts, e.g. a concatenated input).
        delta: ``[E, k, out]`` output gradients.

    Returns:
        ``[E]`` float64: weight plus bias squared norms.
    """
    if delta.ndim != 3 or gram_x.shape != (*delta.shape[:2], delta.shape[1]):
        raise ConfigError(
            "gram_x must be [E, k, k] and delta [E, k, out], got "
            f"{tuple(gram_x.shape)} and {tuple(delta.shape)}"
        )
    d = delta.to(torch.float64)
    weight = (gram_x.to(torch.float64) * torch.bmm(d, d.transpose(1, 2))).sum((1, 2))
    return weight + d.sum(1).square().sum(1)


def sam_releases(*, sam: bool, rho_shared: float, rho_private: float) -> int:
    """Gaussian releases one interaction enters per local SAM step (FedRecGEL).

    Every pass that reads the data and whose result is used is a release: the base gradient
    (always; with ``sam`` it also defines both perturbations), the perturbed gradient of the
    shared parameters (the upload) if ``rho_shared > 0``, and the perturbed gradient of the
    private parameters (the client's own step) if ``rho_private > 0``. Without SAM a step is
    one release. A zero radius reuses the base release instead of a new pass.
    """
    if not isinstance(sam, bool):
        raise ConfigError(f"sam must be True or False, got {sam!r}")
    if not sam:
        return 1
    return 1 + int(rho_shared > 0) + int(rho_private > 0)


def dpsgd_event(round_index: int, *, noise_multiplier: float, example_clip: float) -> PrivacyEvent:
    """The ledger record of one local DP-SGD epoch: one unamplified Gaussian step per example.

    Unit of privacy: one interaction; sensitivity ``example_clip``; the noise is added by the
    client itself (placement ``"local"``), so there is exactly one noise contributor.
    """
    return PrivacyEvent(
        round=round_index,
        mechanism="gaussian",
        noise_multiplier=noise_multiplier,
        sample_rate=1.0,
        clip=example_clip,
        noise_contributors=1,
        min_survivors=1,
        placement="local",
        privacy_unit="interaction",
    )
