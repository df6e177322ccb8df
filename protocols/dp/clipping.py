"""Per-participant L2 clipping of flat updates (DP-FedAvg, McMahan et al. ICLR 2018, Alg. 1)."""

from __future__ import annotations

import numbers

import torch

from protocols.errors import ConfigError, DataError

# Clipped rows are scaled by (1 - _SHRINK) more than clip / norm, so that the float32
# rounding of every coordinate (relative error <= 2**-24) can never push a clipped row's
# exact L2 norm above ``clip``. The bias this adds (2**-20 relative) is far below the noise.
_SHRINK = 2.0**-20


def clip_rows(x: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip every row of ``x`` to L2 norm at most ``clip``, batched over rows.

    Unit of privacy: one row is one participant's whole flat update (user-level DP), so after
    clipping the L2 sensitivity of the sum of rows to adding or removing one participant is
    ``clip`` (McMahan et al. 2018, "Learning differentially private recurrent language
    models", Sec. 2, Algorithm 1, ``ClipFn`` flat clipping).

    Rows whose norm is at most ``clip`` are returned bit-for-bit unchanged; longer rows are
    rescaled (direction kept) so that their norm is at most ``clip``. Norms and scale factors
    are computed in float64.

    Args:
        x: A ``[m, d]`` floating-point tensor, one participant per row.
        clip: The clipping bound C > 0.

    Returns:
        ``(clipped, norms)``: a clipped copy of ``x`` (same dtype and device) and the
        pre-clip L2 norm of every row as a float64 tensor of shape ``[m]``.

    Raises:
        ConfigError: If ``clip`` is not a finite positive number.
        DataError: If ``x`` is not a 2-D floating tensor or holds a non-finite value. Finite
            rows of any size are clipped, also those whose squared norm overflows float64.
    """
    clip = _check_clip(clip)
    if x.ndim != 2 or not x.is_floating_point():
        raise DataError(
            f"updates must be a 2-D floating tensor [clients, dim], got shape "
            f"{tuple(x.shape)} and dtype {x.dtype}"
        )
    x64 = x.to(torch.float64)
    norms = torch.linalg.vector_norm(x64, dim=1)
    overflow = ~torch.isfinite(norms)
    huge: tuple[torch.Tensor, torch.Tensor] | None = None
    if bool(overflow.any()):
        rows = x64[overflow]
        bad = int((~torch.isfinite(rows)).any(dim=1).sum())
        if bad:
            raise DataError(
                f"updates contain NaN or infinite values in {bad} of {x.shape[0]} rows; they "
                "cannot be clipped; check local training for divergence (e.g. lower the "
                "learning rate)"
            )
        # Finite rows whose squared norm overflows float64 (float64 entries near 1e154 and
        # above): the norm is |largest entry| times the norm of the row divided by it. It may
        # still exceed float64 (then inf is the honest value), so such rows are clipped as
        # (row / peak) * (clip / unit norm), which stays finite and keeps the direction.
        peak = rows.abs().amax(dim=1, keepdim=True)
        unit_rows = rows / peak
        unit = torch.linalg.vector_norm(unit_rows, dim=1)
        norms[overflow] = peak[:, 0] * unit
        huge = unit_rows, unit
    over = norms > clip
    factor = _scale_factors(norms, clip)
    clipped = torch.where(over[:, None], (x64 * factor[:, None]).to(x.dtype), x)
    if huge is not None:
        unit_rows, unit = huge
        scaled = unit_rows * (clip * (1.0 - _SHRINK) / unit)[:, None]
        clipped[overflow & over] = scaled[over[overflow]].to(x.dtype)
    return clipped, norms


def clip_scales(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """Per-participant scale ``min(1, clip / norm)`` from the L2 norms of their updates (float32).

    The one rule every path that clips structured updates applies (the in-process and Flower
    aggregators, the popularity prior's release, and the audit's observers, which must see
    exactly what the server sums), the same as :func:`clip_rows`: a participant at or under
    ``clip`` keeps factor exactly 1; a longer one is scaled to ``clip * (1 - 2**-20) / norm``,
    so that float32 rounding of the scaled update cannot push its norm above ``clip``.

    Args:
        norms: Pre-clip L2 norms, shape ``[m]`` (any floating dtype; used in float64).
        clip: The bound C > 0; ``inf`` clips nothing (every factor 1).

    Raises:
        ConfigError: ``clip`` is not a positive number.
    """
    if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not float(clip) > 0.0:
        raise ConfigError(f"clip must be a number > 0, got {clip!r}")
    return _scale_factors(norms.to(torch.float64), float(clip)).to(torch.float32)


#: A norm within this relative distance above the clip is float rounding of an update built
#: to the bound (fedals' and the prior's weights are stored in float32: norms up to
#: ``1 + 7e-8`` of a bound of 1), not an update the clip shortened.
CLIPPED_TOLERANCE = 1e-6


def clipped_rows(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """Which of ``norms`` the clip shortens by more than float rounding
    (:data:`CLIPPED_TOLERANCE`), as a bool tensor. The scaling itself (:func:`clip_scales`)
    applies to every norm above ``clip``."""
    return norms.to(torch.float64) > float(clip) * (1.0 + CLIPPED_TOLERANCE)


def clipped_count(norms: torch.Tensor, clip: float) -> int:
    """How many of ``norms`` :func:`clipped_rows` counts: the ``clipped_fraction`` a round
    reports."""
    return int(clipped_rows(norms, clip).sum())


def _scale_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """``clip (1 - 2^-20) / norm`` where ``norm > clip``, else exactly 1 (float64 in and out)."""
    over = norms > clip
    return torch.where(
        over, clip * (1.0 - _SHRINK) / norms.clamp_min(1e-300), torch.ones_like(norms)
    )


def _check_clip(clip: float) -> float:
    if isinstance(clip, bool) or not isinstance(clip, numbers.Real):
        raise ConfigError(f"clip must be a positive number, got {clip!r}")
    c = float(clip)
    if not (c > 0.0 and c < float("inf")):
        raise ConfigError(f"clip must be a finite number > 0, got {clip!r}")
    return c
