"""HR@k and NDCG@k under the sampled and the full-ranking leave-one-out protocols.

* Sampled (the papers' protocol): the held-out item is ranked among the user's
  ``n_eval_negatives`` (99) sampled negatives, items the user never interacted with.
* Full ranking: the held-out item is ranked among every item the user has no training
  interaction with, excluding the other held-out item (the test item when evaluating
  validation and vice versa), whose label the model must not be rewarded or punished for.

Rank convention (pessimistic): the rank of the target is the number of candidates whose
score is *greater than or equal to* the target's score, i.e. the target is placed after every
candidate with a strictly greater score and after every tie. A constant model therefore gets
HR = 0, not a lucky 1. A NaN score never helps: a NaN target ranks last and NaN candidates rank
ahead of the target.

``rank == 0`` is the top; HR@k = ``rank < k``; NDCG@k = ``1 / log2(rank + 2)`` if ``rank < k``.

Full ranking costs every user x every item. A model whose per-pair score is expensive (an MLP
tower: FedRecGEL) can offer ``score_block(users [B], items [C]) -> [B, C]``; its users are then
ranked against blocks of items in order of training popularity, and a user leaves the pass
once ``k`` candidates score at or above its validation *and* its test item (neither can be in
the top ``k`` any more). HR@k and NDCG@k are those of the whole pass (each rank below ``k`` is
counted over every item; scores equal to the dense pass up to floating-point summation
order); a rank of ``k`` or more is then a lower bound, the count when the user left.
On a large population it can also rank a fixed sample of users instead (``full_users``,
drawn by :func:`eval_user_sample`): the full metrics are then estimates of the all-user
means, with 95 % confidence intervals (normal approximation with the finite-population
correction: the sample is drawn without replacement from the ``N`` users).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch

from securefed.data.types import Split
from securefed.errors import ConfigError

__all__ = [
    "EvalResult",
    "eval_user_sample",
    "Scorer",
    "evaluate",
    "evaluate_splits",
    "hit_ratio",
    "ndcg",
    "ndcg_gains",
    "rank_of_target",
]


class Scorer(Protocol):
    """What evaluation needs from a model (a subset of ``federation.base.Recommender``).

    A model may also define ``score_block(users [B], items [C]) -> [B, C]`` (the same items
    for every user); full ranking then runs in item blocks with early exit (module
    docstring). Worth it where a pair costs far more than a dot product.
    """

    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Scores of ``items [B, C]`` for ``users [B]``, ``[B, C]`` (higher ranks first)."""
        ...

    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        """Scores of every item for ``users [B]``, ``[B, n_items]``."""
        ...


@dataclass(frozen=True, kw_only=True)
class EvalResult:
    """Metrics of one evaluation.

    Attributes:
        which: ``"val"`` or ``"test"``.
        k: The cut-off.
        n_users: Number of users evaluated.
        hr: HR@k under the sampled protocol.
        ndcg: NDCG@k under the sampled protocol.
        full_hr: HR@k under full ranking (``None`` when not computed).
        full_ndcg: NDCG@k under full ranking (``None`` when not computed).
        ranks: Per-user sampled rank (int64, ``n_users``), when requested.
        full_ranks: Per-user full-ranking rank, when requested and computed (for the users
            ranked in full only, in ``full_users`` order).
        full_users: Users ranked in full when a sample (``None``: every user).
        full_hr_ci: 95 % confidence interval of ``full_hr`` for a sample, else ``None``.
        full_ndcg_ci: The same for ``full_ndcg``.
    """

    which: str
    k: int
    n_users: int
    hr: float
    ndcg: float
    full_hr: float | None = None
    full_ndcg: float | None = None
    ranks: np.ndarray | None = None
    full_ranks: np.ndarray | None = None
    full_users: np.ndarray | None = None
    full_hr_ci: tuple[float, float] | None = None
    full_ndcg_ci: tuple[float, float] | None = None


def eval_user_sample(n_users: int, size: int | None, seed: int) -> np.ndarray | None:
    """A fixed, seeded sample of ``size`` users (sorted) for full-ranking evaluation.

    ``None`` when ``size`` is ``None`` or covers every user. The same ``seed`` gives the same
    users in every round and on resume, so the rounds' estimates are comparable.
    """
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"eval users must be a positive integer, got {size!r}")
    if size >= n_users:
        return None
    from protocols.seeding import numpy_generator

    rng = numpy_generator(seed, "eval-users")
    return np.sort(rng.choice(n_users, size=size, replace=False)).astype(np.int64)


def eval_users_note(size: int | None, n_users: int) -> str | None:
    """One line saying that ``eval_users`` samples no one, where ``size`` is not below the
    ``n_users`` users of the loaded data (:func:`eval_user_sample` then ranks every user, as
    without it); None where it samples or is not given. The population is known only once the
    data is loaded, and a config may be reused across datasets, so this is a note rather than
    a refusal (found in a walkthrough: ``--eval-users 5000`` on 395 users said nothing). A new
    run's :class:`~securefed.training.RunStart` and :class:`~securefed.training.RunPlan` carry
    it among their ``notes``."""
    if size is None or size < n_users:
        return None
    return (
        f"eval_users {size:,} is not below the {n_users:,} users of the data: every user is "
        "ranked in full, as without it (no sample, no confidence intervals)"
    )


def _mean_ci(values: torch.Tensor, population: int) -> tuple[float, float]:
    """95 % normal-approximation interval of a sample mean, finite-population corrected."""
    v = values.double()
    n = v.numel()
    mean = float(v.mean())
    if n < 2:
        return (mean, mean)
    fpc = max(0.0, (population - n) / max(population - 1, 1))
    half = 1.959963984540054 * float(v.std(unbiased=True)) * (fpc / n) ** 0.5
    return (max(0.0, mean - half), min(1.0, mean + half))


def _as_tensor(ranks: torch.Tensor | np.ndarray) -> torch.Tensor:
    return ranks if isinstance(ranks, torch.Tensor) else torch.as_tensor(np.asarray(ranks))


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")


def hit_ratio(ranks: torch.Tensor | np.ndarray, k: int) -> float:
    """Mean HR@k of 0-based target ranks (``rank < k`` counts as a hit)."""
    _check_k(k)
    r = _as_tensor(ranks)
    if r.numel() == 0:
        raise ConfigError("cannot compute a metric over zero users")
    return float((r < k).double().mean())


def ndcg_gains(ranks: torch.Tensor | np.ndarray, k: int) -> torch.Tensor:
    """Each user's NDCG@k (float64) from its 0-based target rank: one relevant item, so
    ``1 / log2(rank + 2)`` where ``rank < k``, else 0."""
    _check_k(k)
    r = _as_tensor(ranks).double()
    return torch.where(r < k, 1.0 / torch.log2(r + 2.0), torch.zeros_like(r))


def ndcg(ranks: torch.Tensor | np.ndarray, k: int) -> float:
    """Mean NDCG@k of 0-based target ranks (:func:`ndcg_gains`)."""
    gains = ndcg_gains(ranks, k)
    if gains.numel() == 0:
        raise ConfigError("cannot compute a metric over zero users")
    return float(gains.mean())


def rank_of_target(
    target_scores: torch.Tensor,
    candidate_scores: torch.Tensor,
    candidate_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """0-based rank of each target among its candidates, ties broken against the target.

    Args:
        target_scores: ``[B]`` scores of the held-out items.
        candidate_scores: ``[B, K]`` scores of the candidates (the target excluded).
        candidate_mask: Optional bool ``[B, K]``; ``False`` entries are not candidates.

    Returns:
        int64 ``[B]``: the number of candidates scoring ``>=`` the target (NaN-pessimistic).
    """
    if candidate_scores.ndim != 2 or target_scores.shape != candidate_scores.shape[:1]:
        raise ValueError(
            f"expected target [B] and candidates [B, K], got {tuple(target_scores.shape)} "
            f"and {tuple(candidate_scores.shape)}"
        )
    target = target_scores[:, None]
    ahead = (candidate_scores >= target) | candidate_scores.isnan() | target.isnan()
    if candidate_mask is not None:
        ahead &= candidate_mask
    return ahead.sum(dim=1).to(torch.int64)


def evaluate(
    model: Scorer,
    split: Split,
    *,
    which: Literal["val", "test"],
    k: int = 10,
    batch_size: int = 256,
    full: bool = True,
    per_user: bool = False,
    full_users: np.ndarray | None = None,
) -> EvalResult:
    """Evaluate ``model`` on every user's validation or test item.

    Args:
        model: Anything with ``score(users [B], items [B, K]) -> [B, K]`` and (for
            ``full=True``) ``score_all(users [B]) -> [B, n_items]``.
        split: The leave-one-out split (its sampled negatives fix the sampled protocol).
        which: ``"val"`` or ``"test"``.
        k: Cut-off of HR@k and NDCG@k.
        batch_size: Users scored per call to the model.
        full: Also compute the full-ranking metrics.
        per_user: Keep the per-user ranks in the result.
        full_users: Rank only these users in full (sorted user indices, e.g.
            :func:`eval_user_sample`); the sampled protocol still covers every user.

    Returns:
        The :class:`EvalResult`.

    Raises:
        ConfigError: ``which``, ``k`` or ``batch_size`` is invalid; ``model`` has no
            ``score`` (or, with ``full``, no ``score_all``); ``split`` is not a
            :class:`Split`; or the model was built on a split of other sizes (users x items)
            than ``split``.
    """
    if which not in ("val", "test"):
        raise ConfigError(f"which must be 'val' or 'test', got {which!r}")
    return evaluate_splits(
        model,
        split,
        which=(which,),
        k=k,
        batch_size=batch_size,
        full=full,
        per_user=per_user,
        full_users=full_users,
    )[which]


def _check_model_and_split(model: Any, split: Any, *, full: bool) -> None:
    """One line for a model or split :func:`evaluate_splits` cannot use, before anything is
    scored: no ``score`` (``score_all`` for full ranking), not a :class:`Split`, or a model
    built on a split of other sizes than this one (its scores would index users or items it
    does not have: an IndexError deep inside the model). Compared where the model records
    its split (``model.split``, as every registered model does)."""
    needed = ("score", "score_all") if full else ("score",)
    missing = [name for name in needed if not callable(getattr(model, name, None))]
    if missing:
        raise ConfigError(
            f"evaluate needs a model with {' and '.join(f'{n}()' for n in needed)} (a trained "
            f"recommender, e.g. train(...).model), got {type(model).__name__} without "
            f"{missing[0]}()"
        )
    if not isinstance(split, Split):
        raise ConfigError(
            f"evaluate needs a securefed.data.types.Split (load_split(config) builds one), got "
            f"{type(split).__name__}"
        )
    own = getattr(model, "split", None)
    if isinstance(own, Split) and (own.n_users, own.n_items) != (split.n_users, split.n_items):
        raise ConfigError(
            f"the model was built on {own.n_users} users x {own.n_items} items and the split "
            f"has {split.n_users} x {split.n_items}: evaluate a model on the split it was "
            "trained on (train(...).split)"
        )


def evaluate_splits(
    model: Scorer,
    split: Split,
    *,
    which: tuple[str, ...] = ("val", "test"),
    k: int = 10,
    batch_size: int = 256,
    full: bool = True,
    per_user: bool = False,
    full_users: np.ndarray | None = None,
    users: np.ndarray | None = None,
) -> dict[str, EvalResult]:
    """:func:`evaluate` for several held-out sets with one scoring pass over all items.

    Full ranking dominates the cost of evaluation (every user x every item); scoring once
    and ranking the validation and the test item against the same scores halves it. With
    ``full_users`` only those users are ranked in full (batches of ``batch_size`` of them).
    With ``users`` (sorted, distinct) only those users are evaluated, sampled and in full,
    and every result is over them (a Flower node's own users: the same ranks, row for row,
    as theirs in an evaluation of every user).
    """
    for w in which:
        if w not in ("val", "test"):
            raise ConfigError(f"which must be 'val' or 'test', got {w!r}")
    _check_model_and_split(model, split, full=full)
    _check_k(k)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    held = {"val": torch.from_numpy(split.val_items), "test": torch.from_numpy(split.test_items)}
    negs = {
        "val": torch.from_numpy(split.val_negatives),
        "test": torch.from_numpy(split.test_negatives),
    }

    if users is not None and full_users is not None:
        raise ConfigError("give users or full_users, not both")
    subset = _full_users(users, split.n_users)  # every user without ``users``
    # The negatives' rows of those users (a split of some users only stores theirs alone).
    neg_rows = torch.from_numpy(split.eval_rows(subset.numpy()))
    evaluated = int(subset.numel())
    ranked = None
    if full:
        ranked = subset if users is not None else _full_users(full_users, split.n_users)

    # Ranks go into buffers allocated once: small tensors kept per batch between the batches'
    # large transient ones fence freed heap blocks off (the process keeps freed buffers below
    # 256 MiB in its heap, securefed.allocator), and the heap then grew by about 40 MB a batch
    # (4.8 GB peak RSS for one evaluation of Gowalla's 29,858 users x 40,981 places).
    sampled_ranks = {w: torch.empty(evaluated, dtype=torch.int64) for w in which}
    n_ranked = 0 if ranked is None else int(ranked.numel())
    full_ranks = {w: torch.empty(n_ranked, dtype=torch.int64) for w in which}
    with torch.no_grad():
        for start in range(0, evaluated, batch_size):
            stop = min(start + batch_size, evaluated)
            rows = subset[start:stop]
            for w in which:
                candidates = torch.cat([held[w][rows, None], negs[w][neg_rows[start:stop]]], dim=1)
                scores = model.score(rows, candidates)
                if tuple(scores.shape) != tuple(candidates.shape):
                    raise ValueError(
                        f"model.score returned shape {tuple(scores.shape)}, "
                        f"expected {tuple(candidates.shape)}"
                    )
                scores = scores.detach().cpu()
                sampled_ranks[w][start:stop] = rank_of_target(scores[:, 0], scores[:, 1:])
        found = getattr(model, "score_block", None)
        block_scorer: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = (
            found if callable(found) else None
        )
        order = _popularity_order(split) if block_scorer is not None and n_ranked else None
        for start in range(0, n_ranked, batch_size):
            assert ranked is not None
            batch = ranked[start : start + batch_size]
            candidate = _candidate_mask(split, batch, held)
            stop = start + int(batch.numel())
            if block_scorer is not None and order is not None:  # ranked in item blocks
                blocks = _block_ranks(model, block_scorer, batch, candidate, held, which, order, k)
                for w in which:
                    full_ranks[w][start:stop] = blocks[w]
                continue
            b = int(batch.numel())
            row_ids = torch.arange(b)
            all_scores = model.score_all(batch)
            if tuple(all_scores.shape) != (b, split.n_items):
                raise ValueError(
                    f"model.score_all returned shape {tuple(all_scores.shape)}, "
                    f"expected {(b, split.n_items)}"
                )
            all_scores = all_scores.detach().cpu()
            for w in which:
                target_scores = all_scores[row_ids, held[w][batch]]
                full_ranks[w][start:stop] = rank_of_target(target_scores, all_scores, candidate)

    sample = full_users is not None and ranked is not None and n_ranked < split.n_users
    out: dict[str, EvalResult] = {}
    for w in which:
        ranks = sampled_ranks[w]
        full_r = full_ranks[w] if full else None
        hr_ci = ndcg_ci = None
        if sample and full_r is not None:
            hr_ci = _mean_ci((full_r < k).double(), split.n_users)
            ndcg_ci = _mean_ci(ndcg_gains(full_r, k), split.n_users)
        out[w] = EvalResult(
            which=w,
            k=k,
            n_users=evaluated,
            hr=hit_ratio(ranks, k),
            ndcg=ndcg(ranks, k),
            full_hr=None if full_r is None else hit_ratio(full_r, k),
            full_ndcg=None if full_r is None else ndcg(full_r, k),
            ranks=ranks.numpy() if per_user else None,
            full_ranks=full_r.numpy() if per_user and full_r is not None else None,
            full_users=ranked.numpy() if sample and ranked is not None else None,
            full_hr_ci=hr_ci,
            full_ndcg_ci=ndcg_ci,
        )
    return out


#: Items in the first block of :func:`_block_ranks`; each later block doubles, up to the last.
FIRST_BLOCK = 256
LAST_BLOCK = 8192


def _popularity_order(split: Split) -> torch.Tensor:
    """Every item, most training interactions first (ties: lower index first)."""
    counts = np.bincount(np.asarray(split.train_items, dtype=np.int64), minlength=split.n_items)
    return torch.from_numpy(np.argsort(-counts, kind="stable").astype(np.int64))


def _candidate_mask(
    split: Split, users: torch.Tensor, held: dict[str, torch.Tensor]
) -> torch.Tensor:
    """``[B, n_items]``: True where an item is a full-ranking candidate for the user (not a
    training positive, not one of its held-out items)."""
    b = int(users.numel())
    row_ids = torch.arange(b)
    mask = torch.ones((b, split.n_items), dtype=torch.bool)
    rows, cols = split.train_pairs(users.numpy())
    mask[torch.from_numpy(rows), torch.from_numpy(cols)] = False
    mask[row_ids, held["val"][users]] = False
    mask[row_ids, held["test"][users]] = False
    return mask


def _block_ranks(
    model: Scorer,
    score_block: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    users: torch.Tensor,
    candidate: torch.Tensor,
    held: dict[str, torch.Tensor],
    which: tuple[str, ...],
    order: torch.Tensor,
    k: int,
) -> dict[str, torch.Tensor]:
    """Full-ranking ranks of ``users`` (``candidate``: their :func:`_candidate_mask`) from
    blocks of items, most popular first; a user leaves once every held-out set has ``k``
    candidates at or above its target (module docstring)."""
    pairs = torch.stack([held[w][users] for w in which], dim=1)
    targets = model.score(users, pairs).detach().cpu()
    counts = torch.zeros((int(users.numel()), len(which)), dtype=torch.int64)
    active = torch.arange(int(users.numel()))
    n_items = int(order.numel())
    start, size = 0, FIRST_BLOCK
    while start < n_items and active.numel():
        items = order[start : start + size]
        start += int(items.numel())
        size = min(2 * size, LAST_BLOCK)
        scores = score_block(users[active], items).detach().cpu()
        allowed = candidate[active[:, None], items[None, :]]
        for j in range(len(which)):
            target = targets[active, j, None]
            ahead = (scores >= target) | scores.isnan() | target.isnan()
            counts[active, j] += (ahead & allowed).sum(dim=1)
        active = active[(counts[active] < k).any(dim=1)]
    return {w: counts[:, j] for j, w in enumerate(which)}


def _full_users(full_users: np.ndarray | None, n_users: int) -> torch.Tensor:
    """The users to rank in full, checked: every user, or sorted distinct valid indices."""
    if full_users is None:
        return torch.arange(n_users, dtype=torch.int64)
    u = torch.as_tensor(np.ascontiguousarray(full_users), dtype=torch.int64).reshape(-1)
    if u.numel() == 0:
        raise ConfigError("full_users must name at least one user")
    if int(u.min()) < 0 or int(u.max()) >= n_users or bool((u[1:] <= u[:-1]).any()):
        raise ConfigError(f"full_users must be sorted, distinct user indices in [0, {n_users})")
    return u
