"""Membership inference from the released global model (release observer).

The observer sees only the global model released after training (FedRAP: the item matrix
``C``; FedRecGEL: the shared item embeddings, MLP tower and predict layer) and, for a target
user, the user's whole interaction list. It asks which of those interactions trained the
model. This is the loss/likelihood attack of Yeom et al. ("Privacy Risk in Machine Learning",
CSF 2018) with the reference-model calibration of Carlini et al. ("Membership Inference
Attacks From First Principles", S&P 2022: compare an example's score with its score on
reference models not trained on it), adapted to a personalised recommender, whose private part the
observer must first fit:

1. Fit a fresh private part to *all* of the user's known items (labelled positive) plus the
   recipe's negatives (``num_negatives`` uniform non-interacted items per known item) against
   the *frozen* released model: FedRAP's scorer ``(w_u, b_u)`` with ``D_u = 0`` (a convex
   logistic regression on the rows of ``C``); FedRecGEL's user embeddings ``(p_u, q_u)``
   through the public NCF tower. Batched over users (L-BFGS on the summed per-user losses;
   the problems are independent, so one joint solve is many small ones).
2. Score each known item by its fitted logit. Training pushed the rows of the user's own
   training items towards that user's taste, so members score higher than the user's other
   interactions.
3. Calibrate against a reference model that never saw the data: the recipe's initial global
   model, drawn by the attacker, fitted the same way (same pairs, same private initialisation).
   The score is the logit on the released model minus the logit on the reference (Carlini et
   al.'s per-example calibration with one untrained reference model). Without it the fit alone
   separates the classes: a user's logit level grows with the number of known items (0.98
   correlation on synthetic data), and members come in per-user counts while held-out items
   are two per user, so an *untrained* FedRecGEL model already gave AUC 0.70. The calibrated
   scores are then centred per user: a single reference draw leaves a draw-dependent user
   offset (0.50 or 0.62 on an untrained model for two draws), so only *which* of a user's
   interactions trained the model is scored, not *whether* the user took part (a
   non-participant's items are centred like anyone's and score at chance).

Ground truth: an item is a member when it is a training positive of the user *and* the user
took part in at least one round. Non-members come from the same population: the user's
held-out validation and test interactions, and every interaction of users that never took
part (FedRecGEL's partial cohorts; none when every client trains every round).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from securefed.errors import ConfigError

__all__ = ["known_items", "released_labels", "released_scores"]


def known_items(split: Any, n_real: int, n_users: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (user, item) interaction the attacker knows: training, validation and test items
    of the first ``n_users`` users, real items only. Returns ``(users, items)``, unique pairs."""
    counts = np.diff(split.train_indptr)[:n_users]
    tu = np.repeat(np.arange(n_users), counts)
    ti = np.asarray(split.train_items[: split.train_indptr[n_users]])
    eu = np.arange(n_users)
    users = np.concatenate([tu, eu, eu])
    items = np.concatenate(
        [ti, np.asarray(split.val_items[:n_users]), np.asarray(split.test_items[:n_users])]
    )
    keep = (items >= 0) & (items < n_real)
    key = np.unique(users[keep].astype(np.int64) * n_real + items[keep])
    return key // n_real, key % n_real


def released_labels(split: Any, n_real: int, n_users: int, participated: np.ndarray) -> np.ndarray:
    """``[n_users, n_real]``: True where the item trained the model (a training positive of a
    user who took part in at least one round)."""
    labels = np.zeros((n_users, n_real), dtype=bool)
    counts = np.diff(split.train_indptr)[:n_users]
    tu = np.repeat(np.arange(n_users), counts)
    ti = np.asarray(split.train_items[: split.train_indptr[n_users]])
    keep = (ti < n_real) & participated[tu]
    labels[tu[keep], ti[keep]] = True
    return labels


def _negatives(
    users: np.ndarray, items: np.ndarray, n_users: int, n_real: int, k: int, gen: torch.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``k`` uniform draws per known pair from the user's non-interacted real items (draws
    that hit a known item are dropped: a few per cent)."""
    known = np.zeros((n_users, n_real), dtype=bool)
    known[users, items] = True
    nu = np.repeat(users, k)
    ni = torch.randint(0, n_real, (nu.size,), generator=gen).numpy()
    ok = ~known[nu, ni]
    return nu[ok], ni[ok]


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """torch's deterministic kernels while the users are fitted: the backward of the fits'
    gathers (``w[pu]``, an accumulating ``index_put_``) otherwise adds in an order that varies
    from call to call, which L-BFGS amplifies (raw logits of two identical calls differed by
    up to 0.2 for FedRecGEL, and two identical audits' AUC in the fourth decimal)."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _lbfgs(params: list[torch.Tensor], loss_fn: Any, iterations: int) -> float:
    opt = torch.optim.LBFGS(
        params, lr=1.0, max_iter=iterations, history_size=20, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(loss_fn())


class _FedRAPFit:
    """Scorer ``(w_u, b_u)`` on the released ``C`` with ``D_u = 0``."""

    def __init__(self, released: dict[str, torch.Tensor], config: Any) -> None:
        self.C = released["C"].detach().float()
        self.ridge = 1e-3

    def init(self, n: int, gen: torch.Generator) -> list[torch.Tensor]:
        # A convex problem: start at zero (the optimum does not depend on the start).
        dim = self.C.shape[1]
        return [torch.zeros(n, dim, requires_grad=True), torch.zeros(n, requires_grad=True)]

    def logits(
        self, params: list[torch.Tensor], pu: torch.Tensor, pi: torch.Tensor
    ) -> torch.Tensor:
        w, b = params
        return (w[pu] * self.C[pi]).sum(1) + b[pu]

    def penalty(self, params: list[torch.Tensor]) -> torch.Tensor:
        return 0.5 * self.ridge * params[0].square().sum()


class _FedRecGELFit:
    """User embeddings ``(p_u, q_u)`` through the released NCF tower."""

    def __init__(self, released: dict[str, torch.Tensor], config: Any) -> None:
        self.sh = {k: v.detach().float() for k, v in released.items()}
        self.cfg = config
        self.n_layers = len(config.layers) - 1
        w1 = self.sh["mlp.0.weight"]
        self.w1u = w1[:, : config.mlp_dim]
        self.table = self.sh["embed_item_mlp"] @ w1[:, config.mlp_dim :].T + self.sh["mlp.0.bias"]
        self.ridge = 1e-4

    def init(self, n: int, gen: torch.Generator) -> list[torch.Tensor]:
        # The recipe's initialisation, N(0, 0.01).
        p = (torch.randn(n, self.cfg.gmf_dim, generator=gen) * 0.01).requires_grad_()
        q = (torch.randn(n, self.cfg.mlp_dim, generator=gen) * 0.01).requires_grad_()
        return [p, q]

    def logits(
        self, params: list[torch.Tensor], pu: torch.Tensor, pi: torch.Tensor
    ) -> torch.Tensor:
        p, q = params
        sh, cfg = self.sh, self.cfg
        h = torch.relu((q @ self.w1u.T)[pu] + self.table[pi])
        for k in range(1, self.n_layers):
            h = torch.relu(h @ sh[f"mlp.{k}.weight"].T + sh[f"mlp.{k}.bias"])
        wp = sh["predict.weight"][0]
        gmf = (p[pu] * sh["embed_item_gmf"][pi]) @ wp[: cfg.gmf_dim]
        return gmf + h @ wp[cfg.gmf_dim :] + sh["predict.bias"][0]

    def penalty(self, params: list[torch.Tensor]) -> torch.Tensor:
        return 0.5 * self.ridge * (params[0].square().sum() + params[1].square().sum())


#: The models the released-model attack can fit users of; a model not here gets the attack
#: skipped (``--attacks all``) or refused (named), like an attack its spec lists as unsupported.
FITS: dict[str, type] = {"fedrap": _FedRAPFit, "fedrecgel": _FedRecGELFit}


def _reference_model(model: str, train_config: Any, split: Any, gen: torch.Generator) -> Any:
    """The recipe's initial global model, drawn by the attacker (not the run's own draw)."""
    from securefed.models.registry import get_spec

    net = get_spec(model).build(split, train_config.params, generator=gen)
    return {k: v.clone() for k, v in net.global_parameters().items()}


def _fit_logits(
    fit: Any,
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray],
    known: tuple[np.ndarray, np.ndarray],
    n_users: int,
    n_real: int,
    *,
    init_seed: int,
    iterations: int,
    chunk: int,
) -> tuple[np.ndarray, float]:
    """Fit every user's private part on ``pairs``; the fitted logits of the known pairs."""
    pu, pi, py = pairs
    ku, ki = known
    bounds = np.searchsorted(pu, np.arange(0, n_users + chunk, chunk))
    out = np.full((n_users, n_real), np.nan, dtype=np.float32)
    gen = torch.Generator().manual_seed(init_seed)
    losses = []
    for c, lo in enumerate(range(0, n_users, chunk)):
        hi = min(n_users, lo + chunk)
        a, b = int(bounds[c]), int(bounds[c + 1])
        u = torch.from_numpy(pu[a:b] - lo)
        it = torch.from_numpy(pi[a:b])
        y = torch.from_numpy(py[a:b])
        n = hi - lo
        weight = 1.0 / torch.bincount(u, minlength=n).clamp_min(1).to(torch.float32)[u]
        params = fit.init(n, gen)

        def loss_fn(params=params, u=u, it=it, y=y, weight=weight) -> torch.Tensor:
            z = fit.logits(params, u, it)
            bce = F.binary_cross_entropy_with_logits(z, y, reduction="none")
            return (bce * weight).sum() + fit.penalty(params)

        losses.append(_lbfgs(params, loss_fn, iterations) / n)
        sel = (ku >= lo) & (ku < hi)
        with torch.no_grad():
            z = fit.logits(params, torch.from_numpy(ku[sel] - lo), torch.from_numpy(ki[sel]))
        out[ku[sel], ki[sel]] = z.numpy()
    return out, float(np.mean(losses)) if losses else float("nan")


def released_scores(
    model: str,
    train_config: Any,
    released: dict[str, torch.Tensor],
    split: Any,
    *,
    n_real: int,
    n_users: int,
    generator: torch.Generator,
    iterations: int = 30,
    chunk: int = 256,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Calibrated and raw membership scores of every known (user, item) pair.

    Args:
        model: ``"fedrap"`` or ``"fedrecgel"``.
        train_config: The run's recipe (a :class:`~securefed.training.TrainConfig`).
        released: The released global parameters (named as in the model's layout).
        split: The run's split (the attacker's knowledge of each user's interactions).
        n_real: Real catalogue items (canary items excluded).
        n_users: Real users (canary clients excluded).
        generator: Draws the fitting negatives, the private initialisation and the
            attacker's reference model.
        iterations: L-BFGS iterations per chunk of users.
        chunk: Users fitted together.

    Returns:
        ``(calibrated, raw, info)``: ``[n_users, n_real]`` float32, NaN where the pair is not a
        known interaction; calibrated = raw minus the same fit's logit on the reference model,
        centred per user.
    """
    if model not in FITS:
        raise ConfigError(f"the released-model attack supports {', '.join(FITS)}, got {model!r}")
    make: Any = FITS[model]
    sub = train_config.params
    k = sub.num_negatives
    ku, ki = known_items(split, n_real, n_users)
    nu, ni = _negatives(ku, ki, n_users, n_real, k, generator)
    pu = np.concatenate([ku, nu])
    pi = np.concatenate([ki, ni])
    py = np.concatenate([np.ones(ku.size, np.float32), np.zeros(nu.size, np.float32)])
    order = np.argsort(pu, kind="stable")
    pairs = (pu[order], pi[order], py[order])
    init_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    reference = _reference_model(model, train_config, split, generator)
    kwargs = {"init_seed": init_seed, "iterations": iterations, "chunk": chunk}
    with _deterministic():
        raw, loss = _fit_logits(make(released, sub), pairs, (ku, ki), n_users, n_real, **kwargs)
        ref, ref_loss = _fit_logits(
            make(reference, sub), pairs, (ku, ki), n_users, n_real, **kwargs
        )
    info = {"fit_loss_mean": loss, "reference_fit_loss_mean": ref_loss, "known_pairs": int(ku.size)}
    calibrated = raw - ref
    # Per user, relative to the user's own interactions: what is left of the fit's user-level
    # offset after one reference draw still depends on the draw (0.50 or 0.62 on an untrained
    # model), so only within-user differences are scored.
    with np.errstate(invalid="ignore"):
        calibrated = calibrated - np.nanmean(calibrated, axis=1, keepdims=True)
    return calibrated.astype(np.float32), raw, info
