"""What a node needs to know about each recommender: its private state and its round plan.

A node holds the users of one partition. Their private state (FedRAP: ``D_u``, the scale of
``D_u`` and the scorer ``(w_u, b_u)``; FedRecGEL: the GMF and MLP user embeddings and their
Adam moments and step) never leaves the node and is saved to the node's state directory after
every local training, so it survives a restart. The shared state comes from the server each
round (:func:`global_payload` / :func:`load_global`).

``subset_plan`` restricts a round plan drawn for the whole cohort to this node's users, so the
node spends the run's seeded random numbers exactly as the in-process simulation does and then
trains only its own users (batched). Local training of one user reads and writes only that
user's rows, so the result per user equals the in-process one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from securefed.errors import ConfigError
from securefed.federation.base import ClientUpdates, Recommender, RoundStats
from securefed.models import fedrap as fedrap_mod
from securefed.models import fedrecgel as fedrecgel_mod

#: Per-user entries of each model's ``state_dict`` (first dimension = user).
_PRIVATE = {
    "fedrap": ("D", "d_scale", "w", "b"),
    "fedrecgel": ("user_gmf", "user_mlp", "client_adam"),
}
#: Scalars of the server's model that local training reads (learning-rate schedules).
_SCALARS = {"fedrap": ("lr_args", "lr_network"), "fedrecgel": ()}


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
    return {key: _rows(state[key], users) for key in _PRIVATE[name]}


def load_private(name: str, model: Recommender, users: torch.Tensor, saved: dict) -> None:
    """Put saved private rows of ``users`` back into ``model`` (validated first)."""
    state = model.state_dict()
    for key in _PRIVATE[name]:
        if key not in saved:
            raise ConfigError(f"saved node state lacks {key!r}; was it written by this model?")
        state[key] = _put_rows(state[key], users, saved[key], key)
    model.load_state_dict(state)


def global_payload(name: str, model: Recommender) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The shared tensors and schedule scalars the server sends to every node."""
    arrays = {
        k: v.detach().cpu().numpy().copy()  # a snapshot: the server steps C in place
        for k, v in model.global_parameters().items()  # type: ignore[attr-defined]
    }
    state = model.state_dict()
    return arrays, {k: float(state[k]) for k in _SCALARS[name]}


def load_global(
    name: str, model: Recommender, arrays: dict[str, np.ndarray], scalars: dict[str, float]
) -> None:
    """Install the server's shared tensors and schedule scalars into a node's model."""
    current = model.global_parameters()  # type: ignore[attr-defined]
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
    if name == "fedrap":
        model.C = tensors["C"].clone()  # type: ignore[attr-defined]
    else:
        model.shared = {k: t.clone() for k, t in tensors.items()}  # type: ignore[attr-defined]
    for key in _SCALARS[name]:
        setattr(model, key, float(scalars[key]))


def _subset_fedrap(plan: fedrap_mod.RoundPlan, keep: torch.Tensor) -> fedrap_mod.RoundPlan:
    m = plan.participants.shape[0]
    remap = torch.full((m,), -1, dtype=torch.long)
    remap[keep] = torch.arange(keep.shape[0])
    sample_keep = remap[plan.sample_user] >= 0
    multi_keep = sample_keep[plan.multi_start :]
    return fedrap_mod.RoundPlan(
        participants=plan.participants[keep],
        sample_user=remap[plan.sample_user[sample_keep]],
        sample_item=plan.sample_item[sample_keep],
        sample_label=plan.sample_label[sample_keep],
        batches_per_user=plan.batches_per_user[keep],
        multi_start=int(sample_keep[: plan.multi_start].sum()),
        multi_batch=plan.multi_batch[:, multi_keep],
    )


def _subset_fedrecgel(plan: fedrecgel_mod.RoundPlan, keep: torch.Tensor) -> fedrecgel_mod.RoundPlan:
    m = plan.participants.shape[0]
    remap = torch.full((m,), -1, dtype=torch.long)
    remap[keep] = torch.arange(keep.shape[0])
    sample_keep = remap[plan.sample_client] >= 0
    return fedrecgel_mod.RoundPlan(
        participants=plan.participants[keep],
        sample_client=remap[plan.sample_client[sample_keep]],
        sample_item=plan.sample_item[sample_keep],
        sample_label=plan.sample_label[sample_keep],
        samples_per_client=plan.samples_per_client[keep],
    )


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
        name: ``fedrap`` or ``fedrecgel``.
        model: The node's model (shared state of this round installed).
        cohort: The round's whole cohort (sorted user ids).
        own: The node's users among ``cohort``.
        round_index: The round.
        generator: The round's training generator.
        replay: Draw the round plan for the whole cohort (as the in-process simulation does)
            and train the node's subset of it; otherwise plan the node's users only.

    Returns:
        The node's updates, each row's position in the in-process batch (``None`` without
        replay) and the training statistics of the node's users.
    """
    if not replay:
        updates, stats = model.client_round(own, round_index, generator)
        return updates, None, stats
    plan = model.plan_round(cohort, generator)  # type: ignore[attr-defined]
    mine = torch.isin(plan.participants, own)
    keep = torch.nonzero(mine).squeeze(1)
    if name == "fedrap":
        sub = _subset_fedrap(plan, keep)
        cfg = model.config  # type: ignore[attr-defined]
        if cfg.compile is None:
            # Same kernel choice as the whole cohort's batch would make in-process.
            pairs = torch.unique(plan.sample_user * model.split.n_items + plan.sample_item)  # type: ignore[attr-defined]
            use = pairs.numel() >= 50_000 and fedrap_mod.compile_available()
            model.config = dataclasses.replace(cfg, compile=use)  # type: ignore[attr-defined]
            try:
                updates, stats = model.train_plan(sub, round_index)  # type: ignore[attr-defined]
            finally:
                model.config = cfg  # type: ignore[attr-defined]
        else:
            updates, stats = model.train_plan(sub, round_index)  # type: ignore[attr-defined]
    else:
        sub_gel = _subset_fedrecgel(plan, keep)
        updates, stats = model.train_plan(sub_gel, round_index)  # type: ignore[attr-defined]
        assert isinstance(updates, ClientUpdates)
    return updates, keep, stats


__all__ = ["global_payload", "load_global", "load_private", "private_state", "train_own"]
