"""What a node needs to know about each recommender: its private state and its round plan.

A node holds the users of one partition. Their private state (the model's
``ModelSpec.private_state`` entries: FedRAP's ``D_u``, scale and scorer ``(w_u, b_u)``;
FedRecGEL's user embeddings and Adam moments) never leaves the node and is saved to the node's
state directory after every local training, so it survives a restart. The shared state comes
from the server each round (:func:`global_payload` / :func:`load_global`).

With replay the node draws the round plan for the whole cohort and trains its own users of it
(``model.train_subset``), so it spends the run's seeded random numbers exactly as the
in-process simulation does and then trains only its own users (batched). Local training of
one user reads and writes only that user's rows, so the result per user equals the
in-process one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from securefed.errors import ConfigError
from securefed.federation.base import ClientUpdates, Recommender, RoundStats
from securefed.models.registry import get_spec


def _rows(value: Any, users: torch.Tensor) -> Any:
    if isinstance(value, dict):
        return {k: _rows(v, users) for k, v in value.items()}
    return value[users].clone()


def _put_rows(target: Any, users: torch.Tensor, rows: Any, name: str) -> Any:
    if isinstance(target, dict):
        if not isinstance(rows, dict) or set(rows) != set(target):
            raise ConfigError(f"saved node state entry {name} does not match the model")
        return {k: _put_rows(target[k], users, rows[k], f"{name}.{k}") for k in target}
    if not isinstance(rows, torch.Tensor) or rows.shape[1:] != target.shape[1:]:
        raise ConfigError(f"saved node state entry {name} does not match the model's shape")
    out = target.clone()
    out[users] = rows.to(out.dtype)
    return out


def private_state(name: str, model: Recommender, users: torch.Tensor) -> dict[str, Any]:
    """Copies of ``users``' private rows (what the node saves)."""
    state = model.state_dict()
    return {key: _rows(state[key], users) for key in get_spec(name).private_state}


def load_private(name: str, model: Recommender, users: torch.Tensor, saved: dict) -> None:
    """Put saved private rows of ``users`` back into ``model`` (validated first)."""
    state = model.state_dict()
    for key in get_spec(name).private_state:
        if key not in saved:
            raise ConfigError(f"saved node state lacks {key!r}; was it written by this model?")
        state[key] = _put_rows(state[key], users, saved[key], key)
    model.load_state_dict(state)


def server_state(name: str, model: Recommender) -> dict[str, Any]:
    """What the server's checkpoint keeps of its model: every ``state_dict`` entry except the
    users' private ones (the shared tensors, schedule scalars and the server step's own
    state, e.g. FedRecGEL's server Adam moments)."""
    private = set(get_spec(name).private_state)
    return {k: _copy(v) for k, v in model.state_dict().items() if k not in private}


def load_server_state(name: str, model: Recommender, saved: dict[str, Any]) -> None:
    """Put a :func:`server_state` back into the server's model (private entries untouched).

    Raises:
        KeyError: ``saved`` lacks an entry the model's server state has.
    """
    private = set(get_spec(name).private_state)
    state = model.state_dict()
    missing = sorted(set(state) - private - set(saved))
    if missing:
        raise KeyError(f"server state lacks {missing[:3]}")
    state.update({k: v for k, v in saved.items() if k not in private})
    model.load_state_dict(state)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def global_payload(name: str, model: Recommender) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The shared tensors and schedule scalars the server sends to every node."""
    arrays = {
        k: v.detach().cpu().numpy().copy()  # a snapshot: the server steps C in place
        for k, v in model.global_parameters().items()
    }
    state = model.state_dict()
    return arrays, {k: float(state[k]) for k in get_spec(name).schedule_scalars}


def load_global(
    name: str, model: Recommender, arrays: dict[str, np.ndarray], scalars: dict[str, float]
) -> None:
    """Install the server's shared tensors and schedule scalars into a node's model."""
    current = model.global_parameters()
    if set(arrays) != set(current):
        raise ConfigError(
            f"global parameters {sorted(arrays)} do not match the model's {sorted(current)}"
        )
    for key, value in arrays.items():
        if tuple(value.shape) != tuple(current[key].shape):
            raise ConfigError(
                f"global parameter {key} has shape {tuple(value.shape)}, "
                f"expected {tuple(current[key].shape)}"
            )
    tensors = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in arrays.items()}
    model.set_global_parameters(tensors)
    for key in get_spec(name).schedule_scalars:
        setattr(model, key, float(scalars[key]))


def train_own(
    name: str,
    model: Recommender,
    cohort: torch.Tensor,
    own: torch.Tensor,
    round_index: int,
    generator: torch.Generator,
    *,
    replay: bool,
) -> tuple[ClientUpdates, torch.Tensor | None, RoundStats]:
    """Local training of this node's participants.

    Args:
        name: The registered model name.
        model: The node's model (shared state of this round installed).
        cohort: The round's whole cohort (sorted user ids).
        own: The node's users among ``cohort``.
        round_index: The round.
        generator: The round's training generator.
        replay: Draw the round plan for the whole cohort (as the in-process simulation does)
            and train the node's subset of it (``model.train_subset``); otherwise plan the
            node's users only.

    Returns:
        The node's updates, each row's position in the in-process batch (``None`` without
        replay) and the training statistics of the node's users.
    """
    if not replay:
        updates, stats = model.client_round(own, round_index, generator)
        return updates, None, stats
    if getattr(model, "dpsgd", None) is not None:
        # The replayed plan is the non-private one: it would train without DP-SGD while the
        # server's ledger counts DP-SGD releases (check_config refuses this run).
        raise ConfigError(
            "interaction-level DP cannot replay the in-process plan on a Flower node; drop "
            "--replay-from-seed"
        )
    plan = model.plan_round(cohort, generator)  # type: ignore[attr-defined]
    mine = torch.isin(plan.participants, own)
    keep = torch.nonzero(mine).squeeze(1)
    updates, stats = model.train_subset(plan, keep, round_index)  # type: ignore[attr-defined]
    return updates, keep, stats


__all__ = [
    "global_payload",
    "load_global",
    "load_private",
    "load_server_state",
    "private_state",
    "server_state",
    "train_own",
]
