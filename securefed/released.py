"""Score with a finished run's released model: :func:`load_released`.

A run directory keeps ``model.pt``, the shared parameters after the last round (and, for a
run with the private popularity prior, the released counts its scores add), and no user's
private state. What scoring a user then means depends on the model:

- fedals solves each user's factor from the released item factors and that user's own
  training items, exactly as the user's device does; a popularity count and a centralized
  reference score from ``model.pt`` alone (``clients = "complete"``);
- FedRAP and FedRecGEL keep per-user state on the device (FedRAP's item views, FedRecGEL's
  user embeddings and optimiser state) that ``model.pt`` does not hold. With
  ``--keep-private-state`` the run keeps it in ``checkpoint.pt`` and the loaded model is
  the trained one exactly (``"checkpoint"``); without, each user's state is the model's
  fresh start from the run's seed, as for a user who joins after training (``"fresh"``),
  and its scores are not the run's reported metrics.

Example::

    from securefed.released import load_released
    released = load_released("runs/my-run")
    top = released.recommend(0, k=10)        # item indices, the user's training items left out
    ids = released.item_ids[top]             # the data's own item ids
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from securefed import runs
from securefed.config import TrainConfig, load_config_file
from securefed.errors import ConfigError, IntegrityError

if TYPE_CHECKING:
    from securefed.data.types import Split
    from securefed.federation.base import Recommender

__all__ = ["ReleasedModel", "load_released"]

Clients = Literal["complete", "checkpoint", "fresh"]


@dataclasses.dataclass(frozen=True)
class ReleasedModel:
    """A finished run's model, ready to score its users (:func:`load_released`).

    Attributes:
        config: The run's ``config.toml``.
        split: The run's data, split as it trained (users and items are dense indices).
        model: The recommender (``score``, ``score_all``; with the run's popularity prior
            added where it had one).
        round: The round ``model.pt`` was written after (the run's last).
        clients: Where each user's side of the scores comes from (module docstring).
        user_ids: The data's own user id of each dense user index (None for synthetic data).
        item_ids: The data's own item id of each dense item index (None for synthetic data).
    """

    config: TrainConfig
    split: Split
    model: Recommender
    round: int
    clients: Clients
    user_ids: np.ndarray | None
    item_ids: np.ndarray | None

    def scores(self, user: int) -> torch.Tensor:
        """Scores of every item for the dense user index ``user``, ``[n_items]``."""
        if isinstance(user, bool) or not isinstance(user, int | np.integer):
            raise ConfigError(f"user must be a user index (an integer), got {user!r}")
        if not 0 <= int(user) < self.split.n_users:
            raise ConfigError(
                f"user {user} is not one of the run's {self.split.n_users} users (indices 0 to "
                f"{self.split.n_users - 1}; user_ids maps them to the data's ids)"
            )
        with torch.no_grad():
            out = self.model.score_all(torch.tensor([int(user)], dtype=torch.long))
        return out[0].detach().to(torch.float32).cpu()

    def recommend(self, user: int, k: int = 10, *, exclude_seen: bool = True) -> np.ndarray:
        """The ``k`` highest-scored item indices for ``user``, best first; with
        ``exclude_seen`` (the default) the user's training items are left out (held-out
        validation and test items stay candidates, as in evaluation)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
        scores = self.scores(user).clone()
        if exclude_seen:
            lo, hi = self.split.train_indptr[user], self.split.train_indptr[user + 1]
            seen = torch.as_tensor(self.split.train_items[lo:hi], dtype=torch.long)
            scores[seen] = -torch.inf
        k = min(k, int(torch.isfinite(scores).sum()))
        return torch.topk(scores, k).indices.numpy()


def load_released(run_dir: str | Path) -> ReleasedModel:
    """The released model of the finished run in ``run_dir``, rebuilt on the run's data.

    Reads ``config.toml``, loads and splits the run's data again (checked against the
    fingerprint ``data.json`` holds while a run can resume), builds the model from the run's
    seed and loads ``model.pt`` into it (its popularity prior included), or, where the run
    kept its clients' private state (``--keep-private-state``), the whole final checkpoint.

    Raises:
        ConfigError: ``run_dir`` is not a finished run (no ``config.toml`` or ``model.pt``).
        IntegrityError: ``model.pt`` is damaged, written by another model, or does not fit
            the run's data; or ``model.pt`` of a run with the popularity prior lacks its
            counts (written before 2026-12-08: rerun it).
    """
    from securefed.data.registry import load_dataset
    from securefed.prior import PriorScored, with_prior
    from securefed.training import build_model, load_split

    run = Path(run_dir)
    if not (run / runs.CONFIG_FILE).is_file():
        raise ConfigError(f"{run} is not a run directory (no {runs.CONFIG_FILE})")
    released = runs.load_state(run / runs.MODEL_FILE)
    if released is None:
        raise ConfigError(
            f"{run} holds no {runs.MODEL_FILE}: the run has not finished (resume it with "
            f"securefed train --resume {run})"
        )
    config = TrainConfig.from_dict(load_config_file(run / runs.CONFIG_FILE))
    if released.get("model") != config.model:
        raise IntegrityError(
            f"{run / runs.MODEL_FILE} was written by {released.get('model')!r}, and the run's "
            f"{runs.CONFIG_FILE} says {config.model!r}; restore the run's own files"
        )
    split = load_split(config)
    _check_data(run, split)
    model = with_prior(config, split, build_model(config, split))
    clients: Clients = "complete"
    try:
        if config.spec.private_state and (run / runs.CHECKPOINT_FILE).exists():
            ckpt = runs.load_checkpoint(run)
            model.load_state_dict(ckpt["model"])
            clients = "checkpoint"
        else:
            _load_shared(model, released)
            if config.spec.private_state:
                clients = "fresh"
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise IntegrityError(
            f"{run / runs.MODEL_FILE} does not fit the run's model and data "
            f"({type(exc).__name__}); restore the run's own files"
        ) from None
    if isinstance(model, PriorScored) and clients != "checkpoint":
        prior = released.get("popularity_prior")
        if prior is None:
            raise IntegrityError(
                f"{run / runs.MODEL_FILE} lacks the released popularity counts its scores add "
                "(written before model.pt held them, 2026-12-08); rerun the run"
            )
        model.prior.load_state_dict(prior)
    user_ids = item_ids = None
    if config.dataset != "synthetic":
        data = load_dataset(
            config.dataset,
            data_dir=config.data_dir,
            min_interactions=config.resolved_min_interactions(),
            seed=config.seed,
        )
        user_ids, item_ids = np.asarray(data.user_ids), np.asarray(data.item_ids)
    return ReleasedModel(
        config=config,
        split=split,
        model=model,
        round=int(released.get("round", 0)),
        clients=clients,
        user_ids=user_ids,
        item_ids=item_ids,
    )


def _load_shared(model: Any, released: dict[str, Any]) -> None:
    """``model.pt``'s state into ``model``: the shared parameters of a federated model, the
    whole state of a centralized one (as :func:`securefed.training.released_state` wrote)."""
    state = released["state"]
    if hasattr(model, "set_global_parameters"):
        model.set_global_parameters(state)
    else:
        model.load_state_dict(state)


def _check_data(run: Path, split: Split) -> None:
    """The data loaded again is the run's, where ``data.json`` keeps its fingerprint."""
    from securefed.training import split_fingerprint

    try:
        recorded = json.loads((run / runs.DATA_FILE).read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded is not None and recorded != split_fingerprint(split):
        raise IntegrityError(
            f"the data {run} was trained on has changed since (its {runs.DATA_FILE} "
            "fingerprint differs); restore the run's data file"
        )
