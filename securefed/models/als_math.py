"""Implicit-feedback ALS algebra shared by fedals (federated) and ials (centralized).

The implicit ALS objective of Hu, Koren and Volinsky (ICDM 2008), with binary preference
``p_ui = 1`` on observed pairs and confidence ``c_ui = 1 + alpha`` there (1 elsewhere)::

    L(X, V) = sum_{u,i} c_ui (p_ui - x_u . v_i)^2 + reg (||X||^2 + ||V||^2)

For one side fixed the other is a ridge regression per row. With the Gramian trick (Hu et al.
Sec. 4; Rendle et al., "Revisiting the performance of iALS", 2021) the normal equations of a
user need only the Gramian of all item factors and the user's own items::

    (V^T V + alpha * sum_{i in I_u} v_i v_i^T + reg I) x_u = (1 + alpha) sum_{i in I_u} v_i

Every function here is batched over all rows of a side: the per-row data terms are one sparse
matrix product and the systems are solved with one batched Cholesky factorisation.
"""

from __future__ import annotations

import torch

__all__ = ["frequency_reg", "normal_equations", "solve_rows", "solve_side"]

#: Floats of the fixed side's outer products materialised at once (a block of their columns).
_CHUNK_FLOATS = 1 << 24


def frequency_reg(counts: torch.Tensor, n_other: int, *, alpha: float, reg: float) -> torch.Tensor:
    """Frequency-scaled L2 weights, one per row: ``reg * (1 + alpha * n_r / n_other)``.

    ``n_other + alpha * n_r`` is row ``r``'s total confidence in the loss (``sum_j c_rj`` over
    the ``n_other`` rows of the other side, ``n_r`` of them observed), so each row is
    regularised in proportion to the data term it balances: the frequency-scaled regulariser
    of Rendle et al. ("Revisiting the performance of iALS on item recommendation benchmarks",
    RecSys 2022, arXiv 2110.14037), ``lambda (|I_u| + alpha_0 |I|)^nu`` with ``nu = 1``, in Hu
    et al.'s confidence weights (their ``alpha_0`` is our ``1 / (1 + alpha)``). Its scale is
    set per side, ``lambda = reg / n_other``, so that a row without observations keeps
    ``reg``: with one ``lambda`` for both sides and every catalogue, the ``n_other`` term
    made the weights of Gowalla's rows 20 times MovieLens 100K's and the model fell below a
    popularity count (docs/models.md, "fedals").

    Args:
        counts: Observations of every row ``[n_rows]`` (a user's items, an item's users).
        n_other: Rows of the other side (items for a user, users for an item).
        alpha: Confidence of an observed pair minus one.
        reg: The weight of a row without observations.
    """
    return reg * (1.0 + alpha * counts.to(torch.float64) / max(int(n_other), 1))


def normal_equations(
    factors: torch.Tensor,
    owner: torch.Tensor,
    other: torch.Tensor,
    n_rows: int,
    *,
    alpha: float,
    reg: float | torch.Tensor,
    gram: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The normal equations ``(A [n_rows, d, d], b [n_rows, d])`` of one side.

    Args:
        factors: The fixed side's factors ``[n_other, d]``.
        owner: Row (of the side being solved) of every observation, int64 ``[nnz]``.
        other: Fixed-side index of every observation, int64 ``[nnz]``.
        n_rows: Rows of the side being solved.
        alpha: Confidence of an observed pair minus one.
        reg: L2 regularisation: one number for every row, or one per row ``[n_rows]``
            (:func:`frequency_reg`).
        gram: ``factors^T factors`` when already known (else computed).
    """
    d = factors.shape[1]
    dtype = factors.dtype
    g = factors.T @ factors if gram is None else gram.to(dtype)
    nnz = owner.shape[0]
    # The per-row data terms are sums over observations: one sparse [n_rows, n_other]
    # incidence matrix times the fixed side's outer products (``[n_other, d*d]``, built in
    # column blocks), never the ``[nnz, d, d]`` tensor of per-observation outer products.
    incidence = torch.sparse_coo_tensor(
        torch.stack([owner, other]),
        torch.ones(nnz, dtype=dtype),
        (n_rows, factors.shape[0]),
        check_invariants=False,
    ).coalesce()
    a = torch.empty(n_rows, d * d, dtype=dtype)
    cols = max(d, (_CHUNK_FLOATS // max(factors.shape[0], 1)) // d * d)
    for lo in range(0, d * d, cols):
        hi = min(d * d, lo + cols)
        rows_i = torch.arange(lo, hi) // d
        cols_j = torch.arange(lo, hi) % d
        outer = factors[:, rows_i] * factors[:, cols_j]
        a[:, lo:hi] = torch.sparse.mm(incidence, outer)
    a = a.view(n_rows, d, d).mul_(alpha)
    if isinstance(reg, torch.Tensor):
        a.add_(g).diagonal(dim1=1, dim2=2).add_(reg.to(dtype).unsqueeze(1))
    else:
        a.add_(g + reg * torch.eye(d, dtype=dtype))
    b = torch.sparse.mm(incidence, factors).mul_(1.0 + alpha)
    return a, b


def solve_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``x`` with ``a[r] x[r] = b[r]`` for every row (``a`` symmetric positive definite)."""
    chol, info = torch.linalg.cholesky_ex(a)
    if bool((info != 0).any()):  # not positive definite in floating point: general solve
        return torch.linalg.solve(a, b.unsqueeze(2)).squeeze(2)
    return torch.cholesky_solve(b.unsqueeze(2), chol).squeeze(2)


def solve_side(
    factors: torch.Tensor,
    owner: torch.Tensor,
    other: torch.Tensor,
    n_rows: int,
    *,
    alpha: float,
    reg: float | torch.Tensor,
) -> torch.Tensor:
    """The exact ALS step of one side: every row's ridge solution ``[n_rows, d]``."""
    a, b = normal_equations(factors, owner, other, n_rows, alpha=alpha, reg=reg)
    return solve_rows(a, b)
