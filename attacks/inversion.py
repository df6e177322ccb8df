"""Optimisation-based inversion of one FedRecGEL upload (gradient matching).

After "Deep Leakage from Gradients" (Zhu, Liu, Han; NeurIPS 2019) and its recommender
variant "RAIFLE: Reconstruction Attacks on Interaction-based Federated Learning with
Adversarial Data Manipulation" (NDSS 2025; we implement only its passive gradient-matching
core, no manipulation of the served model): the attacker knows the public
model of the round and the loss, treats the client's private user embeddings ``(p_u, q_u)``
and the labels of the changed rows as unknowns (labels relaxed to ``sigmoid(l_i)``), and
minimises the distance between the gradient those unknowns would produce and the observed
upload with L-BFGS. Simplifications, stated: the SAM perturbation (radius 0.02) is ignored,
every changed row counts as one sample, and the chunk weights ``1 / chunk_size`` are absorbed
by one free positive scale.

FedRAP has no analogue beyond the gradient-ratio attack: its rows depend on the private
``D_u`` through per-row logits, so free per-row logits make the gradient-matching problem the
same rank-one factorisation the gradient-ratio attack already solves exactly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["invert_fedrecgel"]


def _forward(
    params: dict[str, torch.Tensor],
    p: torch.Tensor,
    q: torch.Tensor,
    gmf_rows: torch.Tensor,
    mlp_rows: torch.Tensor,
    n_layers: int,
) -> torch.Tensor:
    gmf = p.unsqueeze(0) * gmf_rows
    h = torch.cat([q.unsqueeze(0).expand(mlp_rows.shape[0], -1), mlp_rows], dim=1)
    for k in range(n_layers):
        h = torch.relu(h @ params[f"mlp.{k}.weight"].T + params[f"mlp.{k}.bias"])
    wp = params["predict.weight"][0]
    return torch.cat([gmf, h], dim=1) @ wp + params["predict.bias"][0]


def invert_fedrecgel(
    target: dict[str, Any], *, iterations: int = 40, seed: int = 0
) -> dict[str, Any]:
    """Recover the user embedding and the labels of the changed rows from one upload.

    Args:
        target: A record written by the recorder: ``upload`` (flat observed upload),
            ``global_before`` (public parameters of the round), ``n_items``.
        iterations: L-BFGS iterations.
        seed: Seeds the initial guess.

    Returns:
        ``{"items", "label_scores", "embedding"}``: the changed rows, a score per row
        (higher = predicted positive) and the recovered GMF user embedding.
    """
    params = {k: v.detach().float() for k, v in target["global_before"].items()}
    n_items = int(target["n_items"])
    gmf_dim = params["embed_item_gmf"].shape[1]
    mlp_dim = params["embed_item_mlp"].shape[1]
    n_layers = sum(1 for k in params if k.startswith("mlp.") and k.endswith(".weight"))
    flat = target["upload"].float()
    g_gmf = flat[: n_items * gmf_dim].view(n_items, gmf_dim)
    g_mlp = flat[n_items * gmf_dim : n_items * (gmf_dim + mlp_dim)].view(n_items, mlp_dim)
    energy = g_gmf.square().sum(1) + g_mlp.square().sum(1)
    items = torch.nonzero(energy > 1e-9 * energy.max().clamp_min(1e-300)).squeeze(1)
    if items.numel() > 2000:
        items = torch.topk(energy, 2000).indices
    obs_gmf, obs_mlp = g_gmf[items], g_mlp[items]
    norm = (obs_gmf.square().sum() + obs_mlp.square().sum()).sqrt().clamp_min(1e-30)
    gen = torch.Generator().manual_seed(seed)
    p = (torch.randn(gmf_dim, generator=gen, dtype=torch.float32) * 0.01).requires_grad_()
    q = (torch.randn(mlp_dim, generator=gen, dtype=torch.float32) * 0.01).requires_grad_()
    logits = torch.zeros(items.numel(), dtype=torch.float32, requires_grad=True)
    log_scale = torch.zeros((), dtype=torch.float32, requires_grad=True)
    P0 = params["embed_item_gmf"][items]
    Q0 = params["embed_item_mlp"][items]
    opt = torch.optim.LBFGS(
        [p, q, logits, log_scale], lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        P = P0.clone().requires_grad_()
        Q = Q0.clone().requires_grad_()
        z = _forward(params, p, q, P, Q, n_layers)
        y = torch.sigmoid(logits)
        loss = F.binary_cross_entropy_with_logits(z, y, reduction="sum")
        gP, gQ = torch.autograd.grad(loss, (P, Q), create_graph=True)
        s = torch.exp(log_scale)
        match = ((s * gP - obs_gmf).square().sum() + (s * gQ - obs_mlp).square().sum()) / norm**2
        match.backward()
        return match

    # The scale starts at the chunk weight of a full chunk (1 / 128).
    with torch.no_grad():
        log_scale.fill_(-4.85)
    loss = opt.step(closure)
    return {
        "items": items,
        "label_scores": logits.detach().clone(),
        "embedding": p.detach().clone(),
        "loss": float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss),
    }
