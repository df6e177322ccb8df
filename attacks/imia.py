"""IMIA: interaction-level membership inference by shadow training (upload observer).

Yuan, Yang, Nguyen, Cui, He, Yin, "Interaction-level Membership Inference Attack Against
Federated Recommender Systems" (WWW 2023), Sec. 4. The honest-but-curious server holds a
target client's round-``t`` upload and the round's public global model, and knows the
training recipe. The upload touches the rows of the client's positives *and* of that round's
negatives; IMIA tells them apart:

1. Guess labels for the touched items (a fraction of them positive).
2. Re-train a *shadow* copy of the client from the round's global model, with a fresh private
   part drawn as the recipe initialises one (FedRAP: ``D_u``, ``w_u``, ``b_u``; FedRecGEL:
   ``p_u``, ``q_u``), on the guessed labels, with the recipe's own local training
   (:meth:`FedRAP.train_plan` / :meth:`FedRecGEL.train_plan` on a plan we build).
3. Compare the shadow's item-row update with the real one item by item: where the guess is
   right the rows agree, where it is wrong they disagree. Confirm the most certain items,
   keep their labels fixed, re-guess the rest and repeat.

Every step is batched over all target clients (one shadow round trains them together); only
the refinement iterations loop.

Departures from the paper, stated:

* Distance between *unit-normalised* update rows instead of raw embeddings. FedRAP moves a
  touched row only along its private scorer ``w_u`` (``-lr (sigmoid(z) - y) w_u`` per step),
  so with a fresh shadow scorer the raw distance is dominated by the two rows' magnitudes;
  the directions agree (cosine ``+c``) or disagree (``-c``) with the sign of the label guess.
* Evidence instead of hard confirmation only: each iteration adds, per item,
  ``(2 g - 1) (mean_u d - d) / std_u d`` (guess supported when its distance is below the
  client's mean); the score is the sum. Items are confirmed (their guess frozen) by the
  magnitude of that evidence, ``1 / (iterations - k)`` of the unconfirmed ones per iteration.
* Orientation (FedRAP): the cosine between a fresh shadow scorer and the real one has a
  random sign, which flips every label. The attacker fixes it with the recipe: the number of
  positives is known from the number of touched rows (each positive brings ``num_negatives``
  uniform draws, see :func:`estimate_positives`), so per client the orientation whose
  predicted-positive count is closer to that estimate wins (as the gradient-ratio attack's
  minority rule). FedRecGEL needs no such rule: its MLP item rows point where the public tower
  sends them, so agreement has a known sign (with the rule, one of 60 synthetic users flipped).
* The shadow's negatives: the touched items guessed negative, sampled
  ``num_negatives * positives`` times in all (each at least once); the real multiplicities are
  unknown.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from securefed.errors import ConfigError

__all__ = ["IMIAObservation", "estimate_positives", "imia_scores", "make_shadow"]


@dataclass(frozen=True)
class IMIAObservation:
    """The touched item rows of the target clients' observed uploads.

    Attributes:
        users: Global user ids of the targets, ``[m]``.
        pair_client: Target position (``0..m-1``) of every touched row, non-decreasing, ``[P]``.
        pair_item: Item of every touched row, ``[P]``.
        rows: The observed row update of every touched row, ``[P, k]`` (FedRAP: ``C_u - s C``;
            FedRecGEL: GMF and MLP item-gradient rows concatenated).
    """

    users: torch.Tensor
    pair_client: torch.Tensor
    pair_item: torch.Tensor
    rows: torch.Tensor


def estimate_positives(touched: torch.Tensor, n_items: int, num_negatives: int) -> torch.Tensor:
    """Positives ``P`` that explain ``T`` touched rows under the recipe's negative sampling.

    Each of the ``P`` positives brings ``num_negatives`` independent uniform draws from the
    ``n_items - P`` other items, so ``E[T] = P + (n - P) (1 - (1 - 1/(n - P))^(k P))``, which
    increases with ``P``; solved by bisection for every client at once.
    """
    t = touched.to(torch.float64)
    lo = torch.zeros_like(t)
    hi = t.clone()
    for _ in range(60):
        mid = (lo + hi) / 2
        free = (n_items - mid).clamp_min(1.0)
        expect = mid + free * (1 - torch.exp(num_negatives * mid * torch.log1p(-1.0 / free)))
        lo = torch.where(expect < t, mid, lo)
        hi = torch.where(expect < t, hi, mid)
    return torch.clamp(torch.round(hi), min=1).to(torch.long).minimum(touched.to(torch.long))


def _shadow_samples(
    pair_client: np.ndarray,
    pair_item: np.ndarray,
    guess: np.ndarray,
    m: int,
    num_negatives: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples of the shadow clients: each guessed positive once, followed by its
    ``num_negatives`` negatives drawn from the guessed-negative touched items (each of those
    sampled at least once), grouped by client. Returns ``(client, item, label)``."""
    k = num_negatives
    pos = guess.astype(bool)
    n1 = np.bincount(pair_client[pos], minlength=m)
    n0 = np.bincount(pair_client[~pos], minlength=m)
    total = np.maximum(k * n1, n0)
    # Negatives: a random order within each client, multiplicities total // n0 (+1 for the first
    # total % n0 of them).
    neg = np.nonzero(~pos)[0]
    nc = pair_client[neg]
    order = np.lexsort((rng.random(neg.size), nc))
    neg, nc = neg[order], nc[order]
    first0 = np.cumsum(n0) - n0
    rank = np.arange(neg.size) - first0[nc]
    base = total[nc] // np.maximum(n0[nc], 1)
    mult = base + (rank < total[nc] % np.maximum(n0[nc], 1))
    neg_s = np.repeat(neg, mult)
    neg_c = pair_client[neg_s]
    # Shuffle the negative samples within a client, then slot them after positive t // k.
    order = np.lexsort((rng.random(neg_s.size), neg_c))
    neg_s, neg_c = neg_s[order], neg_c[order]
    first_s = np.cumsum(total) - total
    t = np.arange(neg_s.size) - first_s[neg_c]
    neg_slot = np.minimum(t // k, np.maximum(n1[neg_c] - 1, 0))
    ps = np.nonzero(pos)[0]
    pc = pair_client[ps]
    order = np.lexsort((rng.random(ps.size), pc))
    ps, pc = ps[order], pc[order]
    first1 = np.cumsum(n1) - n1
    pos_slot = np.arange(ps.size) - first1[pc]
    pairs = np.concatenate([ps, neg_s])
    client = np.concatenate([pc, neg_c])
    slot = np.concatenate([pos_slot, neg_slot])
    within = np.concatenate([np.full(ps.size, -1), t])
    order = np.lexsort((within, slot, client))
    pairs, client = pairs[order], client[order]
    return client, pair_item[pairs], pos[pairs].astype(np.float32)


class _Shadow:
    """Shadow clients of one round; subclasses train them (``run``)."""

    name: str

    def __init__(
        self,
        model: Any,
        config: Any,
        global_before: dict[str, torch.Tensor],
        round_index: int,
        users: torch.Tensor,
    ) -> None:
        self.model = model
        self.config = config
        self.round = round_index
        self.users = users
        self.global_before = global_before
        self.n_items = int(model.split.n_items)

    def rows_at(
        self, updates: Any, pair_client: torch.Tensor, pair_item: torch.Tensor, chunk: int = 64
    ) -> torch.Tensor:
        """The shadow uploads' item rows at the observed pairs, processed exactly as the real
        uploads are (:func:`attacks.rows.item_rows`), ``[P, k]``."""
        from attacks.rows import item_rows

        upc = updates.clients.to(torch.long).cpu()
        order = torch.argsort(upc)
        row_of = order[torch.searchsorted(upc[order], self.users)]
        m = self.users.shape[0]
        bounds = torch.searchsorted(pair_client, torch.arange(0, m + chunk, chunk)).tolist()
        out: list[torch.Tensor] = []
        for j, lo in enumerate(range(0, m, chunk)):
            a, b = bounds[j], bounds[j + 1]
            if a == b:
                continue
            flat = updates.dense(row_of[lo : lo + chunk]).cpu()
            res, _ = item_rows(self.name, flat, self.global_before, self.n_items)
            out.append(res[pair_client[a:b] - lo, pair_item[a:b]])
        return torch.cat(out) if out else torch.zeros(0, 1)


class _FedRAPShadow(_Shadow):
    """Shadow FedRAP clients: the recipe's local training from the round's public ``C``."""

    name = "fedrap"
    #: Rows move only along the private scorer: the sign of agreement is unknown.
    private_orientation = True

    def __init__(
        self,
        split: Any,
        config: Any,
        global_before: dict[str, torch.Tensor],
        round_index: int,
        users: torch.Tensor,
        generator: torch.Generator,
    ) -> None:
        from securefed.models.fedrap import FedRAP

        # Sparse views: the shadows hold only the rows they train on, never users x items
        # x dim (156 GB at Gowalla's size); training is the same bits as with dense views.
        sparse = dataclasses.replace(config, views="sparse")
        super().__init__(
            FedRAP(split, sparse, generator=generator), config, global_before, round_index, users
        )
        n_users, dim = split.n_users, config.dim
        m = users.shape[0]
        # A fresh private part per target, drawn as the recipe draws it (Embedding N(0, 1),
        # Linear U(+-1/sqrt(dim))); the real client's values are never read. Of D_u only the
        # rows the shadow trains on exist, each drawn N(0, 1) the first time it is needed
        # (:meth:`_fresh_rows`) and the same in every later iteration.
        bound = 1.0 / math.sqrt(dim)
        w = torch.zeros(n_users, dim)
        w[users] = (torch.rand(m, dim, generator=generator) * 2 - 1) * bound
        b = torch.zeros(n_users)
        b[users] = (torch.rand(m, generator=generator) * 2 - 1) * bound
        self._keys = torch.zeros(0, dtype=torch.long)  # sorted user * items + item
        self._rows = torch.zeros(0, dim)
        self._generator = generator
        self.fresh = {
            "C": global_before["C"].detach().clone(),
            "D_base": self.model.state_dict()["D_base"].clone(),
            "d_scale": torch.ones(n_users),
            "w": w,
            "b": b,
            # The recipe's schedule: both rates decay by ``decay`` after every round.
            "lr_args": config.lr_args * config.decay**round_index,
            "lr_network": config.lr_network * config.decay**round_index,
        }

    def _fresh_rows(self, keys: torch.Tensor) -> None:
        """Draw the fresh ``D_u[i]`` of the (target, item) ``keys`` not drawn yet."""
        new = keys[~torch.isin(keys, self._keys)]
        if new.numel() == 0:
            return
        rows = torch.randn(new.shape[0], self._rows.shape[1], generator=self._generator)
        keys_all = torch.cat([self._keys, new])
        order = torch.argsort(keys_all)
        self._keys = keys_all[order]
        self._rows = torch.cat([self._rows, rows])[order]

    def run(
        self, client: np.ndarray, item: np.ndarray, label: np.ndarray, generator: torch.Generator
    ) -> Any:
        """Train the shadows on the samples (grouped by target position); their uploads."""
        from securefed.models.fedrap import RoundPlan, epoch_batches

        cfg = self.config
        model = self.model
        m = self.users.shape[0]
        sc = torch.from_numpy(client)
        n_items = self.n_items
        self._fresh_rows(torch.unique(self.users[sc] * n_items + torch.from_numpy(item)))
        state = dict(self.fresh)
        state["D_keys"] = self._keys.clone()
        state["D_rows"] = self._rows.clone()  # taken over by the model: training writes it
        for name in ("D_base", "d_scale", "w", "b"):
            state[name] = self.fresh[name].clone()
        model.load_state_dict(state)
        counts = torch.bincount(sc, minlength=m)
        batches = (counts + cfg.batch_size - 1) // cfg.batch_size
        order = torch.argsort(batches, stable=True)
        new_pos = torch.empty_like(order)
        new_pos[order] = torch.arange(m)
        local = new_pos[sc]
        perm = torch.argsort(local, stable=True)
        users = local[perm]
        items = torch.from_numpy(item)[perm]
        labels = torch.from_numpy(label)[perm]
        batches = batches[order]
        multi_start, multi_batch = epoch_batches(
            users,
            counts[order],
            batches,
            local_epochs=cfg.local_epochs,
            batch_size=cfg.batch_size,
            generator=generator,
        )
        plan = RoundPlan(
            participants=self.users[order],
            sample_user=users,
            sample_item=items,
            sample_label=labels,
            batches_per_user=batches,
            multi_start=multi_start,
            multi_batch=multi_batch,
        )
        up, _ = model.train_plan(plan, self.round)
        return up


class _FedRecGELShadow(_Shadow):
    """Shadow FedRecGEL clients: the recipe's SAM gradient at the round's public model."""

    name = "fedrecgel"
    #: The MLP item rows' direction is set by the public tower (the private ``q_u`` enters
    #: only through ReLU masks), so agreement has a known positive sign.
    private_orientation = False

    def __init__(
        self,
        split: Any,
        config: Any,
        global_before: dict[str, torch.Tensor],
        round_index: int,
        users: torch.Tensor,
        generator: torch.Generator,
    ) -> None:
        from securefed.models.fedrecgel import FedRecGEL

        super().__init__(
            FedRecGEL(split, config, generator=generator), config, global_before, round_index, users
        )
        state = self.model.state_dict()
        state["shared"] = {k: v.detach().clone() for k, v in global_before.items()}
        m = users.shape[0]
        # Fresh private embeddings N(0, 0.01) (the official ``init_client_weight``).
        state["user_gmf"][users] = torch.randn(m, config.gmf_dim, generator=generator) * 0.01
        state["user_mlp"][users] = torch.randn(m, config.mlp_dim, generator=generator) * 0.01
        self.fresh = state

    def run(
        self, client: np.ndarray, item: np.ndarray, label: np.ndarray, generator: torch.Generator
    ) -> Any:
        """Train the shadows on the samples (grouped by target position); their uploads."""
        from securefed.models.fedrecgel import RoundPlan

        model = self.model
        model.load_state_dict(self.fresh)
        m = self.users.shape[0]
        sc = torch.from_numpy(client)
        plan = RoundPlan(
            participants=self.users,
            sample_client=sc,
            sample_item=torch.from_numpy(item),
            sample_label=torch.from_numpy(label),
            samples_per_client=torch.bincount(sc, minlength=m),
        )
        up, _ = model.train_plan(plan, self.round)
        return up


#: The models IMIA has a shadow client for; a model not here gets IMIA skipped (``--attacks
#: all``) or refused (named), like an attack its spec lists as unsupported.
SHADOWS: dict[str, Any] = {"fedrap": _FedRAPShadow, "fedrecgel": _FedRecGELShadow}


def make_shadow(
    model: str,
    split: Any,
    train_config: Any,
    global_before: dict[str, torch.Tensor],
    round_index: int,
    users: torch.Tensor,
    generator: torch.Generator,
) -> Any:
    """The shadow clients of ``users`` for one round (fresh private parts drawn now)."""
    if model not in SHADOWS:
        raise ConfigError(f"IMIA supports {', '.join(SHADOWS)}, got model {model!r}")
    return SHADOWS[model](split, train_config.params, global_before, round_index, users, generator)


def _per_client(x: torch.Tensor, client: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    cnt = torch.bincount(client, minlength=m).to(torch.float64).clamp_min(1)
    mean = torch.zeros(m, dtype=torch.float64).index_add_(0, client, x) / cnt
    var = torch.zeros(m, dtype=torch.float64).index_add_(0, client, (x - mean[client]) ** 2) / cnt
    return mean, var.sqrt()


def _rank_within(key: torch.Tensor, client: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Rank (0 = smallest key) of every eligible entry among its client's eligible entries;
    ineligible entries get a rank past every eligible one."""
    big = key.abs().max().item() * 4 + 4 if key.numel() else 4.0
    k = torch.where(eligible, key, torch.full_like(key, big))
    order = torch.argsort(client.to(torch.float64) * (2 * big + 1) + k, stable=True)
    ordered = client[order]
    first = torch.searchsorted(ordered, ordered)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0]) - first
    return rank


def imia_scores(
    obs: IMIAObservation,
    shadow: Any,
    *,
    n_items: int,
    num_negatives: int,
    iterations: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Membership scores of every touched row (higher = predicted training positive).

    Args:
        obs: The targets' observed touched rows.
        shadow: From :func:`make_shadow` for the same targets and round.
        n_items: Catalogue size (for the positives estimate).
        num_negatives: The recipe's negatives per positive.
        iterations: Refinement iterations (one shadow round each).
        generator: Draws the label guesses and the shadow's sample order.

    Returns:
        ``(scores [P], info)``; info has the per-client positives estimate and orientation.
    """
    if iterations < 1:
        raise ConfigError(f"IMIA iterations must be >= 1, got {iterations!r}")
    m = obs.users.shape[0]
    pc, pi = obs.pair_client, obs.pair_item
    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
    touched = torch.bincount(pc, minlength=m)
    p_hat = estimate_positives(touched, n_items, num_negatives)
    real = obs.rows.double()
    real_unit = real / real.norm(dim=1, keepdim=True).clamp_min(1e-30)
    evidence = torch.zeros(pc.shape[0], dtype=torch.float64)
    confirmed = torch.zeros(pc.shape[0], dtype=torch.bool)
    conf_label = torch.zeros(pc.shape[0], dtype=torch.bool)
    orient = torch.ones(m, dtype=torch.float64)
    pc_np, pi_np = pc.numpy(), pi.numpy()
    for it in range(iterations):
        # Guesses: confirmed labels, plus random positives among the rest up to the estimate.
        conf_pos = torch.bincount(pc[confirmed & conf_label], minlength=m)
        need = (p_hat - conf_pos).clamp_min(0)
        draw = torch.rand(pc.shape[0], generator=generator, dtype=torch.float64)
        rank = _rank_within(draw, pc, ~confirmed)
        guess = torch.where(confirmed, conf_label, (rank < need[pc]) & ~confirmed)
        sc, si, sl = _shadow_samples(pc_np, pi_np, guess.numpy(), m, num_negatives, rng)
        srow = shadow.rows_at(shadow.run(sc, si, sl, generator), pc, pi).double()
        s_unit = srow / srow.norm(dim=1, keepdim=True).clamp_min(1e-30)
        dist = (s_unit - real_unit).norm(dim=1)
        mean, std = _per_client(dist, pc, m)
        sign = guess.to(torch.float64) * 2 - 1
        evidence += sign * (mean[pc] - dist) / std[pc].clamp_min(1e-12)
        # Orientation: the side whose predicted-positive count is closer to the estimate.
        n_pos = torch.bincount(pc[evidence > 0], minlength=m)
        n_neg = torch.bincount(pc[evidence < 0], minlength=m)
        if getattr(shadow, "private_orientation", True):
            orient = torch.where((n_neg - p_hat).abs() < (n_pos - p_hat).abs(), -1.0, 1.0).to(
                torch.float64
            )
        belief = orient[pc] * evidence
        # Confirm the most certain 1 / (iterations - it) of the unconfirmed rows per client.
        left = torch.bincount(pc[~confirmed], minlength=m)
        quota = torch.ceil(left.to(torch.float64) / (iterations - it)).to(torch.long)
        rank = _rank_within(-belief.abs(), pc, ~confirmed)
        new = ~confirmed & (rank < quota[pc])
        conf_label = torch.where(new, belief > 0, conf_label)
        confirmed |= new
    scores = (orient[pc] * evidence / iterations).to(torch.float32)
    return scores, {"positives_estimate": p_hat, "orientation": orient, "touched": touched}
