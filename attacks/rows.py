"""Per-item statistics of observed uploads: the row-change test and the gradient-ratio attack.

Both models upload one row per item of a shared item table:

* FedRAP uploads ``C_u - C``. A client only trains the rows of the items in its samples (its
  positives and this round's negatives); every other row only decays,
  ``C_u[j] - C[j] = (s_u - 1) C[j]`` exactly, with one weight-decay factor ``s_u`` per client.
  The observer estimates ``s_u - 1`` as the median ratio ``<U_j, C_j> / |C_j|^2`` over all
  rows (most rows are untouched) and the row-change statistic is ``|U_j - (s_u - 1) C_j|^2``.
* FedRecGEL uploads SAM gradients: the item-embedding rows (``embed_item_gmf``,
  ``embed_item_mlp``) are exactly zero for items not in the client's samples.

Gradient-ratio attack (Chai et al., "Secure Federated Matrix Factorization", IEEE Intelligent
Systems 2021, Sec. III: with a plain MF upload the item-gradient rows are multiples of the
user embedding, so their ratios reveal it and the multiples' signs reveal the ratings). Here:

* FedRAP: for a local SGD step in round 0 (the curriculum weights lambda, mu start at 0) the
  change of row ``i`` is ``-lr (sigmoid(z_i) - y_i) w_u``, a multiple of the private scorer
  ``w_u``; later rounds add the regularisers but stay close to that direction.
* FedRecGEL: the GMF row is ``(sum_s dz_s) (w_p,gmf * p_u)`` with ``dz = sigmoid(z) - y``:
  a multiple of the private GMF embedding ``p_u`` times the *public* predict weights.

The direction is the top eigenvector of the rows' second-moment matrix (isotropic noise does
not move it); the rows' projections on it are label scores. The sign of a rank-one
factorisation is ambiguous; the attacker fixes it with the recipe: every positive comes with
``num_negatives`` negatives, so among the changed rows the positives are the minority side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from securefed.errors import ConfigError
from securefed.models.registry import ObserverHooks, get_spec

__all__ = ["RowStats", "item_rows", "row_stats", "touched_mask"]


@dataclass(frozen=True)
class RowStats:
    """Per-client, per-item statistics of a chunk of observed uploads.

    Attributes:
        change: ``[c, n_items]`` row-change statistic (squared residual norm).
        touched: ``[c, n_items]`` rows flagged as changed (exactly non-zero without noise;
            above a 4-sigma chi-square threshold with noise).
        label: ``[c, n_items]`` signed projection on the recovered direction (positive side
            = predicted training positive).
        direction: ``[c, k]`` recovered unit direction (FedRAP: ``w_u``; FedRecGEL:
            ``w_p,gmf * p_u``), oriented so that positives project positively.
    """

    change: torch.Tensor
    touched: torch.Tensor
    label: torch.Tensor
    direction: torch.Tensor


def item_rows(
    model: str, flat: torch.Tensor, global_before: dict[str, torch.Tensor], n_items: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split observed flat uploads ``[c, d]`` into item rows for the row test and the ratio.

    The model's own observer hooks say where its rows are (``ModelSpec.observer``).

    Returns:
        ``(rows, ratio_rows)``: ``[c, n_items, k]`` residual rows (FedRAP: after removing the
        estimated weight-decay scaling of the global row; FedRecGEL: GMF and MLP item rows
        concatenated) and the rows that are collinear with the private direction
        (FedRAP: the same rows; FedRecGEL: the GMF rows).
    """
    return observer_hooks(model).item_rows(flat, global_before, n_items)


def observer_hooks(model: str) -> ObserverHooks:
    """The model's observer hooks; a ConfigError when its uploads have no item rows."""
    spec = get_spec(model)
    if spec.observer is None:
        raise ConfigError(f"{model}'s uploads have no per-item rows for the row attacks")
    return spec.observer


def touched_mask(change: torch.Tensor, k: int, *, noise_std: float) -> torch.Tensor:
    """Rows flagged as changed from the row-change statistic ``[c, n_items]`` of ``k``-wide
    rows: exactly non-zero without noise; above a 4-sigma chi-square threshold with noise of
    per-coordinate std ``noise_std``."""
    if noise_std > 0:
        mean = noise_std**2 * k
        threshold = mean + 4.0 * noise_std**2 * math.sqrt(2.0 * k)
        return change > threshold
    peak = change.amax(1, keepdim=True)
    return change > 1e-9 * peak.clamp_min(1e-300)


def row_stats(
    rows: torch.Tensor,
    ratio_rows: torch.Tensor,
    *,
    noise_std: float,
    positives_minority: bool = True,
) -> RowStats:
    """Row-change test and gradient-ratio label scores of a chunk of clients.

    Args:
        rows: ``[c, n_items, k]`` residual rows.
        ratio_rows: ``[c, n_items, k']`` rows collinear with the private direction.
        noise_std: Per-coordinate std of the noise the observer knows is on the rows (0
            for raw uploads).
    """
    change = rows.double().square().sum(-1)
    touched = touched_mask(change, rows.shape[-1], noise_std=noise_std)
    r = ratio_rows.double()
    second = torch.einsum("cik,cil->ckl", r, r)
    _, vecs = torch.linalg.eigh(second)
    direction = vecs[:, :, -1]
    proj = torch.einsum("cik,ck->ci", r, direction)
    # Orientation: positives are the minority of the changed rows when the model samples
    # negatives (FedRAP, FedRecGEL), the majority when every changed row is a positive (fedals).
    flagged = touched
    few = flagged.sum(1) < 5
    if bool(few.any()):
        # Nothing passes the noise test: use the 20 % largest projections by magnitude.
        mag = proj.abs()
        cut = torch.quantile(mag, 0.8, dim=1, keepdim=True)
        flagged = torch.where(few.unsqueeze(1), mag >= cut, flagged)
    n_plus = (flagged & (proj > 0)).sum(1)
    n_minus = (flagged & (proj < 0)).sum(1)
    plus_is_majority = n_plus > n_minus
    if not positives_minority:
        plus_is_majority = ~plus_is_majority
    sign = torch.where(plus_is_majority, -1.0, 1.0).to(proj.dtype)
    return RowStats(
        change=change.float(),
        touched=touched,
        label=(proj * sign.unsqueeze(1)).float(),
        direction=(direction * sign.unsqueeze(1)).float(),
    )
