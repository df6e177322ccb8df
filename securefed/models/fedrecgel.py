"""FedRecGEL: federated recommendation with generalisation-enhanced learning (arXiv 2603.11503).

The scorer is NCF (GMF + MLP, He et al. 2017) split between client and server: every user keeps
two private embeddings ``p_u`` (GMF, ``gmf_dim``) and ``q_u`` (MLP, ``mlp_dim``) that never leave
the device; the item embeddings of both branches, the MLP tower and the predict layer are shared.
The logit of user ``u`` for item ``i`` is::

    z = w_p . [p_u * P_i ; h_L] + b_p,   h_0 = [q_u ; Q_i],   h_k = relu(W_k h_{k-1} + b_k)

The client objective is the official code's: positives plus ``num_negatives`` fresh negatives
per positive, laid out as ``pos, neg, .., neg, pos, ..`` (positives shuffled), cut into
consecutive chunks of ``chunk_size`` samples, loss = sum over chunks of the mean BCE-with-logits.

Sharpness-aware client step (official ``NCFClient.fit_client_epochs``), per client::

    g       = grad L(theta_sh, theta_ns)                        (pass 1)
    g_sh^*  = grad_sh L(theta_sh + rho_sh g_sh / ||g_sh||, theta_ns)   (pass 2)
    g_ns^*  = grad_ns L(theta_sh, theta_ns + rho_ns g_ns / ||g_ns||)   (pass 3)

with one global norm over all shared (resp. both private) tensors, ``eps = 0`` where the norm is
0. The client takes one Adam step (``client_lr``, state kept per client across rounds) on
``theta_ns`` with ``g_ns^*`` and uploads ``g_sh^*``; the server averages the uploads and takes
one Adam step (``server_lr``) on the shared parameters. ``sam=False`` is FedNCF (one pass, plain
gradients).

Batched simulation
------------------
All participants train together, with hand-written forward/backward math instead of autograd:

* samples are laid out chunk-major, ``[K, S]`` (``K`` chunks of ``S <= chunk_size`` slots, each
  chunk owned by one client, only a client's last chunk padded, padding weighted 0), so a
  per-client weight matrix is one batched matmul per chunk and a per-client weight gradient is
  one ``bmm`` per chunk followed by a sum over the client's chunks;
* the first MLP layer is split ``W_1 = [W_1u | W_1i]``; with shared weights its user half is a
  per-client ``[m, h]`` term and its item half a per-item ``[n_items, h]`` table, gathered;
* per-client item-embedding gradients live on the unique (client, item) pairs of the round and
  are uploaded in that form (:class:`FedRecGELUpdates`): a client's gradient of an item table is
  zero on every item it did not touch, so its rows on the touched items plus the dense MLP and
  predict-layer gradients are the whole upload; the ``[m, d]`` matrix is built only when a
  protocol asks for rows of it (secure aggregation).

``tests/test_fedrecgel.py`` checks the result against a per-client autograd loop.

Interaction-level DP (``dpsgd=...``)
------------------------------------
With a :class:`~protocols.dp.dpsgd.DPSGDConfig` each client runs DP-SGD on its own
interactions (``docs/privacy.md``, "Interaction-level DP", FedRecGEL): an example is one
positive with ``num_negatives`` negatives drawn uniformly from all items, a client's examples
are one batch, and each SAM pass that reads data is a Gaussian release -- the base gradient
over all parameters (which defines both perturbations), the shared gradient at the perturbed
shared point (the upload) and the private gradient at the perturbed private point (the
client's Adam step). Each clips every example's gradient over the parameters it releases
(closed-form ghost norms, :meth:`FedRecGEL._dp_pass`) and adds noise to every coordinate of
them, so the upload is dense (:class:`~securefed.federation.base.DenseUpdates`).
``tests/test_dp_interaction_fedrecgel.py`` checks norms and clipped sums against Opacus.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from protocols.dp.dpsgd import (
    DPSGDConfig,
    clip_factors,
    embedding_rows_sq_norms,
    fill_gaussian_,
    linear_ghost_sq_norms,
    sam_releases,
)
from protocols.dp.noise import gaussian_noise
from securefed.costs import EVAL_BLOCK, CostInputs, ModelCosts, ModelWork, RunShape
from securefed.data.negatives import NegativeSampler
from securefed.data.types import Split
from securefed.errors import ConfigError
from securefed.federation.base import (
    Aggregate,
    ClientUpdates,
    DenseUpdates,
    RoundStats,
    UpdateLayout,
    block_buffer,
    pairs_by_item,
    write_item_rows,
)
from securefed.federation.cohort import CohortSpec
from securefed.models.fedrap import example_weights, uniform_negatives
from securefed.models.registry import ModelSpec, ObserverHooks, PrivateMode
from securefed.validation import check_field_types, positive_int

__all__ = [
    "DPSGDPlan",
    "FedRecGEL",
    "FedRecGELConfig",
    "FedRecGELUpdates",
    "RoundDiagnostics",
    "RoundPlan",
    "sam_scale",
]

_BETA1 = 0.9
_BETA2 = 0.999
_ADAM_EPS = 1e-8
_SAM_EPS = 1e-12  # the official ``rho / (||g|| + 1e-12)``
_GMF = "embed_item_gmf"
_MLP = "embed_item_mlp"


@dataclass(frozen=True, kw_only=True)
class FedRecGELConfig:
    """FedRecGEL hyperparameters; defaults follow the official code (``models/ncf.py``).

    Attributes:
        gmf_dim: GMF embedding size (users and items).
        mlp_dim: MLP embedding size (users and items); ``layers[0]`` must be ``2 * mlp_dim``.
        layers: Widths of the MLP tower, input first (``Linear(layers[k], layers[k+1])`` + ReLU).
        rho_shared: SAM radius of the shared parameters (``rho_sh``).
        rho_private: SAM radius of the private user embeddings (``rho_ns``).
        sam: ``False`` gives the FedNCF ablation (plain gradients, one pass).
        client_lr: Adam learning rate of the private embeddings.
        server_lr: Adam learning rate of the server (the official code hard-codes 0.001).
        num_negatives: Fresh negatives per training positive per round.
        negatives_from: ``"train"`` (leak-free) or ``"history"``; see
            :mod:`securefed.data.negatives`.
        chunk_size: Samples per loss chunk (the official ``bs = 128``).
        local_steps: Local steps per round; the official FedRecGEL client takes exactly one.
    """

    gmf_dim: int = 32
    mlp_dim: int = 128
    layers: tuple[int, ...] = (256, 128, 64, 32)
    rho_shared: float = 0.02
    rho_private: float = 0.02
    sam: bool = True
    client_lr: float = 0.1
    server_lr: float = 0.001
    num_negatives: int = 4
    negatives_from: Literal["train", "history"] = "train"
    chunk_size: int = 128
    local_steps: int = 1

    def __post_init__(self) -> None:
        check_field_types(self)  # the checks below assume the types
        for name in ("gmf_dim", "mlp_dim", "num_negatives", "chunk_size"):
            positive_int(name, getattr(self, name))
        layers = tuple(self.layers)
        if len(layers) < 2 or any(
            isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in layers
        ):
            raise ConfigError(
                f"layers must be at least two positive integers (input width first), "
                f"got {self.layers!r}"
            )
        if layers[0] != 2 * self.mlp_dim:
            raise ConfigError(
                f"layers[0] must be 2 * mlp_dim = {2 * self.mlp_dim} (user and item MLP "
                f"embeddings concatenated), got {layers[0]!r}"
            )
        object.__setattr__(self, "layers", layers)
        for name in ("rho_shared", "rho_private"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be >= 0, got {value!r}")
        for name in ("client_lr", "server_lr"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
        if not isinstance(self.sam, bool):
            raise ConfigError(f"sam must be True or False, got {self.sam!r}")
        if self.negatives_from not in ("train", "history"):
            raise ConfigError(
                f"negatives_from must be 'train' or 'history', got {self.negatives_from!r}"
            )
        if isinstance(self.local_steps, bool) or self.local_steps != 1:
            raise ConfigError(
                f"local_steps must be 1 (the official FedRecGEL client takes one SAM step per "
                f"round), got {self.local_steps!r}"
            )


def sam_scale(sq_norms: torch.Tensor, rho: float) -> torch.Tensor:
    """Per-client SAM step factors: ``eps_c = sam_scale(||g_c||^2)[c] * g_c``.

    ``rho / (||g_c|| + 1e-12)`` as in the official ``_sam_perturb_from_grads``, and 0 where the
    gradient is 0 (no perturbation), so ``||eps_c|| = rho`` up to the 1e-12 guard otherwise.

    Args:
        sq_norms: Squared global gradient norms, one per client, ``[m]``.
        rho: SAM radius (``>= 0``).
    """
    norm = sq_norms.sqrt()
    scale = rho / (norm + _SAM_EPS)
    return torch.where(norm > 0, scale, torch.zeros_like(scale))


@dataclass(frozen=True)
class RoundPlan:
    """The samples of one round in each client's official order.

    Attributes:
        participants: Global user ids of the cohort, ``[m]`` (upload row order).
        sample_client: Participant position (``0..m-1``) of every sample, non-decreasing.
        sample_item: Item of every sample; within a client ``pos, neg x num_negatives, pos, ..``.
        sample_label: 1.0 for positives, 0.0 for negatives.
        samples_per_client: ``[m]``.
    """

    participants: torch.Tensor
    sample_client: torch.Tensor
    sample_item: torch.Tensor
    sample_label: torch.Tensor
    samples_per_client: torch.Tensor


@dataclass(frozen=True)
class RoundDiagnostics:
    """Norms of the last round's SAM perturbations (zeros with ``sam=False``), ``[m]`` each."""

    shared_eps_norm: torch.Tensor
    private_eps_norm: torch.Tensor


@dataclass
class _Batch:
    """A round plan in the chunk-major ``[K, S]`` layout plus its (client, item) pairs."""

    m: int
    chunk_client: torch.Tensor  # [K]
    item: torch.Tensor  # [K, S]
    label: torch.Tensor  # [K, S]
    weight: torch.Tensor  # [K, S], 1 / chunk size, 0 on padding
    pair: torch.Tensor  # [K, S] pair index of every slot
    pair_client: torch.Tensor  # [P]
    pair_item: torch.Tensor  # [P]


@dataclass
class _Pass:
    """Per-client results of one forward/backward pass."""

    loss: torch.Tensor  # [m]
    d_user_gmf: torch.Tensor  # [m, gmf_dim]
    d_user_mlp: torch.Tensor  # [m, mlp_dim]
    dense: dict[str, torch.Tensor] | None  # name -> [m, *shape] (non-embedding shared params)
    pair_gmf: torch.Tensor | None  # [P, gmf_dim]
    pair_mlp: torch.Tensor | None  # [P, mlp_dim]


@dataclass
class _Block:
    """What one block of clients yields: per-client results, pairs local to the block."""

    loss: torch.Tensor  # [mb]
    shared_eps_norm: torch.Tensor  # [mb]
    private_eps_norm: torch.Tensor  # [mb]
    pair_client: torch.Tensor  # [Pb], positions within the block
    pair_item: torch.Tensor  # [Pb]
    pair_gmf: torch.Tensor  # [Pb, gmf_dim]
    pair_mlp: torch.Tensor  # [Pb, mlp_dim]
    rest: torch.Tensor  # [mb, d_rest]


@dataclass(frozen=True)
class DPSGDPlan:
    """The examples of one interaction-level DP-SGD round (one batch per client).

    Attributes:
        participants: Global user ids, ``[m]`` (upload row order).
        example_client: Participant position of every example, ``[E]``, non-decreasing.
        example_items: ``[E, 1 + num_negatives]``: the positive, then uniform negatives.
        example_weight: ``[E]`` 1 for a real example, 0 for a null one (zero gradient; see
            :attr:`Split.null_positives`).
    """

    participants: torch.Tensor
    example_client: torch.Tensor
    example_items: torch.Tensor
    example_weight: torch.Tensor


@dataclass
class _DPBatch:
    """A block's examples in rows of ``R`` examples, each row owned by one client."""

    m: int
    row_client: torch.Tensor  # [K]
    items: torch.Tensor  # [K, R, k+1], positive first
    mask: torch.Tensor  # [K, R], 1.0 on real examples, 0.0 on padding


@dataclass
class _DPPass:
    """Per-example norms and per-client sums of clipped gradients of one DP-SGD pass."""

    loss: torch.Tensor  # [m], summed BCE over the client's samples
    sq_norms: torch.Tensor  # [K * R] float64, unclipped, of the pass's part (0 on padding)
    factor: torch.Tensor  # [K * R] clip factors
    shared: dict[str, torch.Tensor] | None  # name -> [m, *shape] (item tables dense)
    user_gmf: torch.Tensor | None  # [m, gmf_dim]
    user_mlp: torch.Tensor | None  # [m, mlp_dim]


#: Bytes of dense per-client shared-parameter buffers a DP-SGD block may hold (about six
#: ``layout.size`` floats per client: releases, perturbation, per-client sums).
_DP_MAX_BYTES = 1024**3

#: Sample slots per block of clients (``train_plan``): 2**15 slots of the 128-wide first MLP
#: layer are 16 MiB per activation tensor, under glibc's 32 MiB ceiling for serving freed
#: memory again from the heap. Larger tensors are mapped fresh (page faults, kernel zeroing)
#: every time: at fraction 1.0 on MovieLens 100K that was more system than user CPU time.
_BLOCK_SLOTS = 1 << 15
#: Slots per row of the batched layout (``_batch``): a client's last row is padded, so narrower
#: rows waste fewer multiply-adds (FilmTrust, ~130 samples per client: 32% of the slots are
#: padding at 128, 19% at 64) but need more per-row weight copies and gradients; 64 measured
#: fastest on FilmTrust and MovieLens 100K.
_ROW_WIDTH = 64


def _blocks(plan: RoundPlan, chunk_size: int) -> list[RoundPlan]:
    """``plan`` (at least one client) cut into plans of consecutive clients of at most
    ``_BLOCK_SLOTS`` padded slots each; a client with more samples forms its own block."""
    n = plan.samples_per_client
    row = min(_ROW_WIDTH, chunk_size)
    padded = ((n + row - 1) // row * row).tolist()
    cuts, total = [0], 0
    for c, size in enumerate(padded):
        if total and total + size > _BLOCK_SLOTS:
            cuts.append(c)
            total = 0
        total += size
    cuts.append(len(padded))
    first = [0, *torch.cumsum(n, 0).tolist()]
    out: list[RoundPlan] = []
    for a, z in zip(cuts[:-1], cuts[1:], strict=True):
        lo, hi = first[a], first[z]
        out.append(
            RoundPlan(
                participants=plan.participants[a:z],
                sample_client=plan.sample_client[lo:hi] - a,
                sample_item=plan.sample_item[lo:hi],
                sample_label=plan.sample_label[lo:hi],
                samples_per_client=n[a:z],
            )
        )
    return out


def _take(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for an index of any shape (``index_select``: much faster on CPU)."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, *table.shape[1:])


def _scatter_sum(x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """``out[index[k]] += x[k]`` into ``rows`` rows.

    ``scatter_add_`` with a stride-0 expanded index: on CPU ``index_add_`` over many indices
    was an order of magnitude slower here.
    """
    out = torch.zeros((rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
    return out.scatter_add_(0, index.view((-1,) + (1,) * (x.ndim - 1)).expand_as(x), x)


def _seg(x: torch.Tensor, chunk_client: torch.Tensor, m: int) -> torch.Tensor:
    """Per-client sums of ``[K, ...]`` per-chunk values."""
    return _scatter_sum(x, chunk_client, m)


def _adam_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor | int,
    lr: float,
) -> None:
    """torch.optim.Adam's update (no weight decay, no amsgrad), in place.

    ``step`` is the step number after this update: an int, or a per-row int tensor ``[rows]``
    for row-wise independent optimizers (one per client).
    """
    exp_avg.lerp_(grad, 1 - _BETA1)
    exp_avg_sq.mul_(_BETA2).addcmul_(grad, grad, value=1 - _BETA2)
    if isinstance(step, int):
        bc1 = 1 - _BETA1**step
        bc2_sqrt = math.sqrt(1 - _BETA2**step)
        denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(_ADAM_EPS)
        param.addcdiv_(exp_avg, denom, value=-lr / bc1)
        return
    t = step.to(torch.float64)
    shape = (-1,) + (1,) * (param.ndim - 1)
    step_size = (lr / (1 - _BETA1**t)).to(param.dtype).view(shape)
    bc2_rows = (1 - _BETA2**t).sqrt().to(param.dtype).view(shape)
    denom_rows = (exp_avg_sq.sqrt() / bc2_rows).add_(_ADAM_EPS)
    param.sub_(step_size * exp_avg / denom_rows)


class FedRecGELUpdates(ClientUpdates):
    """FedRecGEL uploads in structured form: item-table rows on the touched items + the rest.

    A client's SAM gradient of ``embed_item_gmf`` / ``embed_item_mlp`` is zero on every item
    that is not among its samples, so the upload is exactly, coordinate for coordinate, the
    dense flat vector in ``layout`` with those rows filled in and every other item row 0; the
    L2 norm over the stored rows and ``rest`` is the dense norm, and clipping factors and
    weighted sums computed here equal the dense ones up to float summation order.

    Attributes:
        clients: Global user ids, ``[m]`` (row order of the flat updates).
        layout: The model's update layout (the two item tables first).
        pair_client: Position in ``clients`` of every stored row, ``[P]``.
        pair_item: Item of every stored row, ``[P]``; (client, item) pairs are distinct.
        pair_gmf: Gradient rows of ``embed_item_gmf``, ``[P, gmf_dim]``.
        pair_mlp: Gradient rows of ``embed_item_mlp``, ``[P, mlp_dim]``.
        rest: The remaining parameters' gradients in layout order, flat, ``[m, d_rest]``.
    """

    def __init__(
        self,
        *,
        clients: torch.Tensor,
        layout: UpdateLayout,
        pair_client: torch.Tensor,
        pair_item: torch.Tensor,
        pair_gmf: torch.Tensor,
        pair_mlp: torch.Tensor,
        rest: torch.Tensor,
    ) -> None:
        if layout.names[:2] != (_GMF, _MLP):
            raise ValueError(f"layout must start with {_GMF}, {_MLP}, got {layout.names[:2]}")
        (n_items, gmf_dim), (_, mlp_dim) = layout.shapes[0], layout.shapes[1]
        p = pair_client.shape[0]
        m = clients.shape[0]
        if pair_item.shape != (p,) or pair_gmf.shape != (p, gmf_dim):
            raise ValueError("pair_item and pair_gmf must hold one row per pair")
        if pair_mlp.shape != (p, mlp_dim):
            raise ValueError("pair_mlp must hold one row per pair")
        if rest.shape != (m, layout.size - n_items * (gmf_dim + mlp_dim)):
            raise ValueError(f"rest must be [clients, d_rest], got {tuple(rest.shape)}")
        self.clients = clients
        self.layout = layout
        self.pair_client = pair_client
        self.pair_item = pair_item
        self.pair_gmf = pair_gmf
        self.pair_mlp = pair_mlp
        self.rest = rest
        self._by_item: tuple[torch.Tensor, torch.Tensor] | None = None

    def dense(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        m = len(self)
        if rows is None:
            rows = torch.arange(m, dtype=torch.long, device=self.rest.device)
        out = torch.zeros(rows.shape[0], self.layout.size, device=self.rest.device)
        position = torch.full((m,), -1, dtype=torch.long, device=self.rest.device)
        position[rows] = torch.arange(rows.shape[0], dtype=torch.long, device=rows.device)
        keep = torch.nonzero(position[self.pair_client] >= 0).squeeze(1)
        views = self.layout.split(out)
        row, item = position[self.pair_client[keep]], self.pair_item[keep]
        views[_GMF][row, item] = self.pair_gmf[keep]
        views[_MLP][row, item] = self.pair_mlp[keep]
        out[:, self.layout.size - self.rest.shape[1] :] = self.rest[rows]
        return out

    def dense_block(self, lo: int, hi: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Coordinates ``lo .. hi - 1`` of every upload (the same values as :meth:`dense`):
        the stored GMF and MLP item rows that reach into the block and the block's part of
        ``rest``, in work proportional to the block."""
        (n_items, gmf_dim), (_, mlp_dim) = self.layout.shapes[0], self.layout.shapes[1]
        out = block_buffer(out, len(self), hi - lo, zero=True, device=self.rest.device)
        if self._by_item is None:  # once per round's uploads (a race only repeats it)
            self._by_item = pairs_by_item(self.pair_item, n_items)
        for offset, width, values in (
            (0, gmf_dim, self.pair_gmf),
            (n_items * gmf_dim, mlp_dim, self.pair_mlp),
        ):
            write_item_rows(
                out,
                lo,
                hi,
                offset=offset,
                width=width,
                n_items=n_items,
                client=self.pair_client,
                item=self.pair_item,
                rows=values.__getitem__,
                by_item=self._by_item,
            )
        rest = self.layout.size - self.rest.shape[1]
        if hi > rest:
            start = max(lo, rest)
            out[:, start - lo :] = self.rest[:, start - rest : hi - rest]
        return out

    def norms(self) -> torch.Tensor:
        pair_sq = self.pair_gmf.double().square().sum(1) + self.pair_mlp.double().square().sum(1)
        sq = torch.zeros(len(self), dtype=torch.float64, device=self.rest.device)
        sq.index_add_(0, self.pair_client, pair_sq)
        return (sq + self.rest.double().square().sum(1)).sqrt()

    def weighted_sum(self, weights: torch.Tensor) -> torch.Tensor:
        w = weights.to(device=self.rest.device, dtype=torch.float32)
        total = torch.zeros(self.layout.size, device=self.rest.device)
        views = self.layout.split(total)
        pw = _take(w, self.pair_client).unsqueeze(1)
        views[_GMF].index_add_(0, self.pair_item, pw * self.pair_gmf)
        views[_MLP].index_add_(0, self.pair_item, pw * self.pair_mlp)
        total[self.layout.size - self.rest.shape[1] :] = w @ self.rest
        return total


class FedRecGEL:
    """FedRecGEL (and FedNCF with ``sam=False``) with all participants simulated batched.

    Args:
        split: The leave-one-out split (training positives per user).
        config: Hyperparameters.
        generator: Draws the initial parameters.
        device: Where the parameters live.
        dpsgd: Interaction-level DP-SGD settings (``None``: the non-private client step).
        noise_seed: Run seed from which each round's DP-SGD noise generator is derived.
    """

    name = "fedrecgel"

    def __init__(
        self,
        split: Split,
        config: FedRecGELConfig,
        *,
        generator: torch.Generator,
        device: str | torch.device = "cpu",
        dpsgd: DPSGDConfig | None = None,
        noise_seed: int = 0,
    ) -> None:
        self.split = split
        self.config = config
        self.dpsgd = dpsgd
        self.noise_seed = noise_seed
        self.device = torch.device(device)
        n_users, n_items = split.n_users, split.n_items
        widths = config.layers
        names = [_GMF, _MLP]
        shapes: list[tuple[int, ...]] = [(n_items, config.gmf_dim), (n_items, config.mlp_dim)]
        for k in range(len(widths) - 1):
            names += [f"mlp.{k}.weight", f"mlp.{k}.bias"]
            shapes += [(widths[k + 1], widths[k]), (widths[k + 1],)]
        names += ["predict.weight", "predict.bias"]
        shapes += [(1, config.gmf_dim + widths[-1]), (1,)]
        self.layout = UpdateLayout(names=tuple(names), shapes=tuple(shapes))
        self._rest_size = sum(self.layout.sizes[2:])
        self.n_layers = len(widths) - 1

        # Initialisation of the official ``init_serve_weights`` / ``init_client_weight``.
        def normal(*shape: int) -> torch.Tensor:
            return torch.empty(shape).normal_(0.0, 0.01, generator=generator)

        shared: dict[str, torch.Tensor] = {
            _GMF: normal(n_items, config.gmf_dim),
            _MLP: normal(n_items, config.mlp_dim),
        }
        for k in range(self.n_layers):
            w = torch.empty(widths[k + 1], widths[k])
            torch.nn.init.xavier_uniform_(w, generator=generator)
            shared[f"mlp.{k}.weight"] = w
            shared[f"mlp.{k}.bias"] = torch.zeros(widths[k + 1])
        wp = torch.empty(1, config.gmf_dim + widths[-1])
        # kaiming_uniform_(a=1, nonlinearity="sigmoid"): gain 1, bound sqrt(3 / fan_in).
        torch.nn.init.kaiming_uniform_(wp, a=1, nonlinearity="sigmoid", generator=generator)
        shared["predict.weight"] = wp
        shared["predict.bias"] = torch.zeros(1)
        self.shared = {k: v.to(self.device) for k, v in shared.items()}
        self._table_cache: tuple[tuple[torch.Tensor, ...], tuple[int, ...], torch.Tensor] | None = (
            None
        )
        self.user_gmf = normal(n_users, config.gmf_dim).to(self.device)
        self.user_mlp = normal(n_users, config.mlp_dim).to(self.device)

        self._client_adam = {
            "user_gmf.exp_avg": torch.zeros_like(self.user_gmf),
            "user_gmf.exp_avg_sq": torch.zeros_like(self.user_gmf),
            "user_mlp.exp_avg": torch.zeros_like(self.user_mlp),
            "user_mlp.exp_avg_sq": torch.zeros_like(self.user_mlp),
            "step": torch.zeros(n_users, dtype=torch.long, device=self.device),
        }
        self._server_step = 0
        self._server_exp_avg = {k: torch.zeros_like(v) for k, v in self.shared.items()}
        self._server_exp_avg_sq = {k: torch.zeros_like(v) for k, v in self.shared.items()}

        self._sampler = NegativeSampler(split, config.negatives_from)
        self._train_indptr = torch.from_numpy(np.asarray(split.train_indptr, dtype=np.int64))
        self._train_items = torch.from_numpy(np.asarray(split.train_items, dtype=np.int64))
        self.last_round: RoundDiagnostics | None = None

    # ------------------------------------------------------------------ planning
    def plan_round(self, participants: torch.Tensor, generator: torch.Generator) -> RoundPlan:
        """Shuffle every participant's positives and draw their negatives (official order).

        Draws, in this order: one uniform key per positive (the shuffle), then the negatives.
        """
        cfg = self.config
        participants, local, counts, pos_items, _ = self._positives(participants)
        # Per-client shuffle (the official ``random.shuffle(pos_items)``): sort by client + key.
        key = torch.rand(local.shape[0], generator=generator, dtype=torch.float64)
        order = torch.argsort(local.to(torch.float64) + key)
        pos_items = pos_items[order]
        neg = self._sampler.sample(participants[local], cfg.num_negatives, generator)
        k = cfg.num_negatives + 1
        items = torch.cat([pos_items.unsqueeze(1), neg], dim=1).reshape(-1)
        labels = torch.zeros(pos_items.shape[0], k)
        labels[:, 0] = 1.0
        return RoundPlan(
            participants=participants,
            sample_client=local.repeat_interleave(k),
            sample_item=items,
            sample_label=labels.reshape(-1),
            samples_per_client=counts * k,
        )

    def _positives(
        self, participants: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Checked distinct participants, then each of their training positives with its
        client position: ``(participants, local, counts, items, index)``, grouped by client
        (``index``: the positions of the items in ``split.train_items``)."""
        participants = self._check_users(participants, "participants")
        if torch.unique(participants).numel() != participants.numel():
            raise ConfigError("participants must be distinct user indices, got a repeated one")
        m = participants.shape[0]
        starts = self._train_indptr[participants]
        counts = self._train_indptr[participants + 1] - starts
        local = torch.repeat_interleave(torch.arange(m), counts)
        first = torch.cumsum(counts, 0) - counts
        index = starts[local] + torch.arange(local.shape[0]) - first[local]
        return participants, local, counts, self._train_items[index], index

    def _batch(self, plan: RoundPlan) -> _Batch:
        """Row-major layout and (client, item) pairs of a plan.

        A client's samples fill ``ceil(n / R)`` rows of ``R = min(_ROW_WIDTH, chunk_size)``
        slots; each sample weighs ``1 / |its loss chunk|`` (chunks of ``chunk_size``), so the
        row width only decides padding, not the loss.
        """
        cs = self.config.chunk_size
        width_max = min(_ROW_WIDTH, cs)
        m = plan.participants.shape[0]
        n = plan.samples_per_client
        n_items = self.split.n_items
        rows = (n + width_max - 1) // width_max
        row_first = torch.cumsum(rows, 0) - rows
        n_rows = int(rows.sum())
        width = int(min(width_max, int(n.max())))
        c = plan.sample_client
        t = torch.arange(c.shape[0]) - (torch.cumsum(n, 0) - n)[c]
        size = torch.minimum(n[c] - (t // cs) * cs, torch.tensor(cs))  # its loss chunk's size
        flat = (row_first[c] + t // width_max) * width + t % width_max
        chunk_client = torch.repeat_interleave(torch.arange(m), rows)
        n_chunks = n_rows
        item = torch.zeros(n_chunks * width, dtype=torch.long)
        item[flat] = plan.sample_item
        label = torch.zeros(n_chunks * width)
        label[flat] = plan.sample_label
        weight = torch.zeros(n_chunks * width)
        weight[flat] = 1.0 / size.to(torch.float32)
        # Padding (zero weight, only in a client's last row) repeats the row's first item, so
        # that every pair is one the client really touched.
        item = item.view(n_chunks, width)
        item = torch.where(weight.view(n_chunks, width) > 0, item, item[:, :1]).reshape(-1)
        # Unique (client, item) pairs through a dense mark over the m x n_items key space.
        keys = chunk_client.repeat_interleave(width) * n_items + item
        mark = torch.zeros(m * n_items, dtype=torch.bool)
        mark[keys] = True
        pair_key = torch.nonzero(mark).squeeze(1)
        rank = torch.cumsum(mark, 0) - 1
        dev = self.device
        return _Batch(
            m=m,
            chunk_client=chunk_client.to(dev),
            item=item.view(n_chunks, width).to(dev),
            label=label.view(n_chunks, width).to(dev),
            weight=weight.view(n_chunks, width).to(dev),
            pair=_take(rank, keys).view(n_chunks, width).to(dev),
            pair_client=(pair_key // n_items).to(dev),
            pair_item=(pair_key % n_items).to(dev),
        )

    # ------------------------------------------------------------------ training
    def client_round(
        self, participants: torch.Tensor, round_index: int, generator: torch.Generator
    ) -> tuple[ClientUpdates, RoundStats]:
        """Train all participants (batched); upload their SAM gradients of the shared params."""
        if self.dpsgd is not None:
            noise = self.dpsgd.round_generator(self.noise_seed, round_index)
            return self.train_dpsgd(
                self.plan_dpsgd_round(participants, generator), round_index, noise
            )
        return self.train_plan(self.plan_round(participants, generator), round_index)

    def train_plan(self, plan: RoundPlan, round_index: int) -> tuple[FedRecGELUpdates, RoundStats]:
        """One round of local training for the samples of ``plan``.

        Clients are independent within a round (the shared parameters change only in the
        server step), so they are trained in blocks of consecutive clients of about
        ``_BLOCK_SLOTS`` samples: the per-sample activations of a block stay small enough for
        the allocator to reuse their memory instead of mapping fresh pages for every tensor.
        """
        cfg = self.config
        m = plan.participants.shape[0]
        glob = plan.participants.to(self.device)
        if m == 0:
            self.last_round = RoundDiagnostics(torch.zeros(0), torch.zeros(0))
            none = torch.zeros(0, dtype=torch.long, device=self.device)
            updates = FedRecGELUpdates(
                clients=glob,
                layout=self.layout,
                pair_client=none,
                pair_item=none,
                pair_gmf=torch.zeros(0, cfg.gmf_dim, device=self.device),
                pair_mlp=torch.zeros(0, cfg.mlp_dim, device=self.device),
                rest=torch.zeros(0, self._rest_size, device=self.device),
            )
            return updates, RoundStats(float("nan"), 0)
        sh = self.shared
        # Shared-weight table of passes 1 and 3: ``Q @ W_1i^T + b_1`` per item.
        item_table = sh[_MLP] @ sh["mlp.0.weight"][:, cfg.mlp_dim :].T + sh["mlp.0.bias"]
        blocks = [self._train_block(sub, item_table) for sub in _blocks(plan, cfg.chunk_size)]
        offsets = torch.tensor([0] + [blk.loss.shape[0] for blk in blocks]).cumsum(0)
        self.last_round = RoundDiagnostics(
            shared_eps_norm=torch.cat([blk.shared_eps_norm for blk in blocks]),
            private_eps_norm=torch.cat([blk.private_eps_norm for blk in blocks]),
        )
        updates = FedRecGELUpdates(
            clients=glob,
            layout=self.layout,
            pair_client=torch.cat(
                [blk.pair_client + int(o) for blk, o in zip(blocks, offsets, strict=False)]
            ),
            pair_item=torch.cat([blk.pair_item for blk in blocks]),
            pair_gmf=torch.cat([blk.pair_gmf for blk in blocks]),
            pair_mlp=torch.cat([blk.pair_mlp for blk in blocks]),
            rest=torch.cat([blk.rest for blk in blocks]),
        )
        loss = float(torch.cat([blk.loss for blk in blocks]).mean())
        return updates, RoundStats(loss=loss, samples=int(plan.sample_item.shape[0]))

    def _train_block(self, plan: RoundPlan, item_table: torch.Tensor) -> _Block:
        """The three passes, the private Adam step and the uploads of a block of clients."""
        cfg = self.config
        m = plan.participants.shape[0]
        glob = plan.participants.to(self.device)
        b = self._batch(plan)
        ug, um = self.user_gmf[glob], self.user_mlp[glob]
        sh = self.shared
        gmf_rows = _take(sh[_GMF], b.item)
        base = self._pass(b, ug, um, per_client=None, gmf_rows=gmf_rows, table=item_table)
        assert base.dense is not None and base.pair_gmf is not None and base.pair_mlp is not None
        zeros = torch.zeros(m, device=self.device)
        sh_grad, ns_grad = base, base
        sh_norm, ns_norm = zeros, zeros
        if cfg.sam and cfg.rho_shared > 0:
            sq = _scatter_sum(
                base.pair_gmf.square().sum(1) + base.pair_mlp.square().sum(1), b.pair_client, m
            )
            for g in base.dense.values():
                sq += g.reshape(m, -1).square().sum(1)
            s = sam_scale(sq, cfg.rho_shared)
            eps = {k: s.view((-1,) + (1,) * sh[k].ndim) * g for k, g in base.dense.items()}
            s_pair = _take(s, b.pair_client).unsqueeze(1)
            eps_gmf, eps_mlp = s_pair * base.pair_gmf, s_pair * base.pair_mlp
            sh_norm = _scatter_sum(
                eps_gmf.square().sum(1) + eps_mlp.square().sum(1), b.pair_client, m
            )
            for e in eps.values():
                sh_norm += e.reshape(m, -1).square().sum(1)
            sh_norm = sh_norm.sqrt()
            sh_grad = self._pass(
                b,
                ug,
                um,
                per_client={k: sh[k] + e for k, e in eps.items()},
                gmf_rows=gmf_rows + _take(eps_gmf, b.pair),
                mlp_rows=_take(sh[_MLP], b.item) + _take(eps_mlp, b.pair),
            )
        if cfg.sam and cfg.rho_private > 0:
            sq = base.d_user_gmf.square().sum(1) + base.d_user_mlp.square().sum(1)
            s = sam_scale(sq, cfg.rho_private).unsqueeze(1)
            eps_ug, eps_um = s * base.d_user_gmf, s * base.d_user_mlp
            ns_norm = (eps_ug.square().sum(1) + eps_um.square().sum(1)).sqrt()
            ns_grad = self._pass(
                b,
                ug + eps_ug,
                um + eps_um,
                per_client=None,
                gmf_rows=gmf_rows,
                table=item_table,
                want_shared=False,
            )

        self._client_adam_step(glob, ns_grad.d_user_gmf, ns_grad.d_user_mlp)

        # The upload: SAM gradients of the shared parameters, item tables on the touched rows.
        assert sh_grad.dense is not None and sh_grad.pair_gmf is not None
        assert sh_grad.pair_mlp is not None
        return _Block(
            loss=base.loss,
            shared_eps_norm=sh_norm,
            private_eps_norm=ns_norm,
            pair_client=b.pair_client,
            pair_item=b.pair_item,
            pair_gmf=sh_grad.pair_gmf,
            pair_mlp=sh_grad.pair_mlp,
            rest=torch.cat([g.reshape(m, -1) for g in sh_grad.dense.values()], dim=1),
        )

    def _client_adam_step(
        self, glob: torch.Tensor, grad_gmf: torch.Tensor, grad_mlp: torch.Tensor
    ) -> None:
        """Private step: one Adam step per client (``glob``) on its own state."""
        adam = self._client_adam
        step = adam["step"][glob] + 1
        adam["step"][glob] = step
        for name, param, grad in (
            ("user_gmf", self.user_gmf, grad_gmf),
            ("user_mlp", self.user_mlp, grad_mlp),
        ):
            p, ea, es = param[glob], adam[f"{name}.exp_avg"][glob], adam[f"{name}.exp_avg_sq"][glob]
            _adam_(p, grad, ea, es, step, self.config.client_lr)
            param[glob] = p
            adam[f"{name}.exp_avg"][glob] = ea
            adam[f"{name}.exp_avg_sq"][glob] = es

    # ------------------------------------------------------------------ DP-SGD
    def plan_dpsgd_round(self, participants: torch.Tensor, generator: torch.Generator) -> DPSGDPlan:
        """Examples of an interaction-level round: every positive + uniform negatives.

        Negatives come from all items (:func:`securefed.models.fedrap.uniform_negatives`),
        so no example's draw depends on any other interaction. The whole round is one batch
        per client (the official client takes one step), so no shuffle is needed.
        """
        participants, local, _, pos, index = self._positives(participants)
        neg = uniform_negatives(
            pos.shape[0], self.config.num_negatives, self.split.n_items, generator
        )
        return DPSGDPlan(
            participants=participants,
            example_client=local,
            example_items=torch.cat([pos.unsqueeze(1), neg], dim=1),
            example_weight=example_weights(self.split, index),
        )

    @property
    def releases_per_step(self) -> int:
        """Gaussian releases per local step in DP-SGD mode (:func:`sam_releases`)."""
        cfg = self.config
        return sam_releases(sam=cfg.sam, rho_shared=cfg.rho_shared, rho_private=cfg.rho_private)

    def train_dpsgd(
        self, plan: DPSGDPlan, round_index: int, noise_generator: torch.Generator | None
    ) -> tuple[DenseUpdates, RoundStats]:
        """Every participant's DP-SGD SAM step; uploads the noised shared gradient (dense).

        Release 1: the base gradient over all parameters, per example clipped as one vector,
        noise on every shared coordinate and on the user's embeddings; it defines both SAM
        perturbations. Release 2 (``rho_shared > 0``): the gradient of the shared parameters
        at the perturbed shared point, clipped over the shared parameters, noised on all of
        them: the upload. Release 3 (``rho_private > 0``): the gradient of the private
        embeddings at the perturbed private point, clipped and noised over them: the client's
        Adam step. Without SAM release 1 gives both. Each release is the sum of clipped
        gradients plus ``N(0, (sigma clip)^2)`` times the constant ``(k+1) / chunk_size``
        (the official loss's per-sample weight ``1 / chunk_size``).

        Batched over clients in blocks that bound both the sample slots and the dense
        per-client buffers (``_DP_MAX_BYTES``).
        """
        assert self.dpsgd is not None
        dp, cfg = self.dpsgd, self.config
        m = plan.participants.shape[0]
        glob = plan.participants.to(self.device)
        uploads = torch.zeros(m, self.layout.size, device=self.device)
        k1 = plan.example_items.shape[1]
        counts = torch.bincount(plan.example_client, minlength=m)
        losses = torch.zeros(m, dtype=torch.float64)
        sh_norms, ns_norms = torch.zeros(m), torch.zeros(m)
        per_row = max(1, _ROW_WIDTH // k1)
        max_clients = max(1, _DP_MAX_BYTES // (6 * 4 * self.layout.size))
        padded = ((counts + per_row - 1) // per_row * per_row * k1).tolist()
        cuts, total = [0], 0
        for c, size in enumerate(padded):
            if total and (total + size > _BLOCK_SLOTS or c - cuts[-1] >= max_clients):
                cuts.append(c)
                total = 0
            total += size
        cuts.append(m)
        first = [0, *torch.cumsum(counts, 0).tolist()]
        scale = k1 / cfg.chunk_size
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            if hi == lo:
                continue
            ex = slice(first[lo], first[hi])
            b = self._dp_batch(counts[lo:hi], plan.example_items[ex], plan.example_weight[ex])
            loss, sh_n, ns_n, upload = self._dpsgd_block(b, glob[lo:hi], dp, scale, noise_generator)
            uploads[lo:hi] = upload
            losses[lo:hi] = loss.double().cpu()
            sh_norms[lo:hi], ns_norms[lo:hi] = sh_n.cpu(), ns_n.cpu()
        self.last_round = RoundDiagnostics(shared_eps_norm=sh_norms, private_eps_norm=ns_norms)
        stats = RoundStats(
            loss=float((losses / cfg.chunk_size).mean()) if m else float("nan"),
            samples=int(plan.example_items.numel()),
        )
        return DenseUpdates(clients=glob, vectors=uploads, layout=self.layout), stats

    def _dpsgd_block(
        self,
        b: _DPBatch,
        glob: torch.Tensor,
        dp: DPSGDConfig,
        scale: float,
        gen: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The DP-SGD SAM step of one block; returns (loss, eps norms x2, upload rows)."""
        cfg, m = self.config, b.m
        std, secure, clip = dp.noise_std, dp.secure, dp.example_clip
        ug, um = self.user_gmf[glob], self.user_mlp[glob]

        def shared_release(sums: dict[str, torch.Tensor]) -> torch.Tensor:
            out = torch.empty(m, self.layout.size, device=self.device)
            fill_gaussian_(out, std, generator=gen, secure=secure)
            for name, view in self.layout.split(out).items():
                view.add_(sums[name])
            return out.mul_(scale)

        def private_release(s_ug: torch.Tensor, s_um: torch.Tensor) -> tuple[torch.Tensor, ...]:
            n_ug = gaussian_noise(s_ug.shape, std, generator=gen, secure=secure)
            n_um = gaussian_noise(s_um.shape, std, generator=gen, secure=secure)
            return (s_ug + n_ug.to(s_ug)) * scale, (s_um + n_um.to(s_um)) * scale

        base = self._dp_pass(b, ug, um, eps=None, part="all", clip=clip)
        assert base.shared is not None and base.user_gmf is not None
        assert base.user_mlp is not None
        g_sh = shared_release(base.shared)
        g_ug, g_um = private_release(base.user_gmf, base.user_mlp)
        upload, p_ug, p_um = g_sh, g_ug, g_um
        sh_norm = ns_norm = torch.zeros(m, device=self.device)
        if cfg.sam and cfg.rho_shared > 0:
            s = sam_scale(g_sh.double().square().sum(1), cfg.rho_shared).to(g_sh)
            eps_flat = g_sh * s.unsqueeze(1)
            sh_norm = torch.linalg.vector_norm(eps_flat, dim=1)
            star = self._dp_pass(
                b, ug, um, eps=self.layout.split(eps_flat), part="shared", clip=clip
            )
            del eps_flat
            assert star.shared is not None
            upload = shared_release(star.shared)
        if cfg.sam and cfg.rho_private > 0:
            sq = g_ug.double().square().sum(1) + g_um.double().square().sum(1)
            s = sam_scale(sq, cfg.rho_private).to(g_ug).unsqueeze(1)
            e_ug, e_um = s * g_ug, s * g_um
            ns_norm = (e_ug.square().sum(1) + e_um.square().sum(1)).sqrt()
            star = self._dp_pass(b, ug + e_ug, um + e_um, eps=None, part="private", clip=clip)
            assert star.user_gmf is not None and star.user_mlp is not None
            p_ug, p_um = private_release(star.user_gmf, star.user_mlp)
        self._client_adam_step(glob, p_ug, p_um)
        return base.loss, sh_norm, ns_norm, upload

    def _dp_batch(
        self, counts: torch.Tensor, items: torch.Tensor, weight: torch.Tensor | None = None
    ) -> _DPBatch:
        """Examples of consecutive clients in rows of ``R = _ROW_WIDTH // (k+1)`` examples,
        each row owned by one client; padding examples (mask 0) only in a client's last row.
        A null example (``weight`` 0) gets mask 0 like padding: zero gradient, same scale."""
        m = counts.shape[0]
        n_ex, k1 = items.shape
        per_row = max(1, _ROW_WIDTH // k1)
        rows = (counts + per_row - 1) // per_row
        row_first = torch.cumsum(rows, 0) - rows
        n_rows = int(rows.sum())
        client = torch.repeat_interleave(torch.arange(m), counts)
        t = torch.arange(n_ex) - (torch.cumsum(counts, 0) - counts)[client]
        slot = (row_first[client] + t // per_row) * per_row + t % per_row
        grid = torch.zeros(n_rows * per_row, k1, dtype=torch.long)
        grid[slot] = items
        mask = torch.zeros(n_rows * per_row)
        mask[slot] = 1.0 if weight is None else weight
        dev = self.device
        return _DPBatch(
            m=m,
            row_client=torch.repeat_interleave(torch.arange(m), rows).to(dev),
            items=grid.view(n_rows, per_row, k1).to(dev),
            mask=mask.view(n_rows, per_row).to(dev),
        )

    def _dp_pass(
        self,
        b: _DPBatch,
        ug: torch.Tensor,
        um: torch.Tensor,
        *,
        eps: dict[str, torch.Tensor] | None,
        part: Literal["all", "shared", "private"],
        clip: float,
    ) -> _DPPass:
        """Forward/backward with per-example norms and per-client sums of clipped gradients.

        An example is a positive and its negatives, loss = mean BCE of its ``k+1`` samples.
        Its gradient restricted to ``part`` (``"all"``: shared and private parameters as one
        vector) is clipped to ``clip``; norms are closed form (:mod:`protocols.dp.dpsgd`):
        Gram matrices of the ``k+1`` samples per linear layer (ghost norms) and per item
        table, direct ``[E, dim]`` vectors for the user embeddings. The clipped sums are the
        batched matmuls of the inputs with per-example scaled output gradients.

        Args:
            b: The block's examples.
            ug, um: Private embeddings of the block's clients (possibly perturbed).
            eps: ``None`` for the shared parameters, else per-client perturbations of every
                shared tensor, ``name -> [m, *shape]`` (SAM pass 2).
            part: Which parameters' gradient is clipped and summed.
            clip: The example clip.
        """
        cfg, sh = self.config, self.shared
        n_rows, per_row, k1 = b.items.shape
        m, t_slots, n_items = b.m, per_row * k1, self.split.n_items
        n_ex = n_rows * per_row
        g_dim, d_mlp = cfg.gmf_dim, cfg.mlp_dim
        cc = b.row_client
        it = b.items.view(n_rows, t_slots)
        key = cc.unsqueeze(1) * n_items + it
        gmf_rows, mlp_rows = _take(sh[_GMF], it), _take(sh[_MLP], it)
        if eps is None:
            weights = [sh[f"mlp.{k}.weight"] for k in range(self.n_layers)]
            biases = [sh[f"mlp.{k}.bias"] for k in range(self.n_layers)]
            wp, bp = sh["predict.weight"][0], sh["predict.bias"][0]
        else:
            gmf_rows = gmf_rows + _take(eps[_GMF].reshape(m * n_items, g_dim), key)
            mlp_rows = mlp_rows + _take(eps[_MLP].reshape(m * n_items, d_mlp), key)

            def per(name: str) -> torch.Tensor:  # perturbed per-client tensor, one per row
                return _take(sh[name] + eps[name], cc)

            weights = [per(f"mlp.{k}.weight") for k in range(self.n_layers)]
            biases = [per(f"mlp.{k}.bias").unsqueeze(1) for k in range(self.n_layers)]
            wp, bp = per("predict.weight"), per("predict.bias")  # [K, 1, f], [K, 1]
        ugc, umc = _take(ug, cc), _take(um, cc)

        # ---- forward
        w0u, w0i = weights[0][..., :d_mlp], weights[0][..., d_mlp:]
        a = umc.unsqueeze(1) @ w0u.mT + mlp_rows @ w0i.mT + biases[0]
        pre, acts = [a], [torch.relu(a)]
        for k in range(1, self.n_layers):
            pre.append(acts[-1] @ weights[k].mT + biases[k])
            acts.append(torch.relu(pre[-1]))
        gm = ugc.unsqueeze(1) * gmf_rows
        feats = torch.cat([gm, acts[-1]], dim=2)
        z = (feats * wp).sum(2) + bp
        label = torch.zeros(n_rows, per_row, k1, device=self.device)
        label[..., 0] = 1.0
        label = label.view(n_rows, t_slots)
        mask = b.mask.repeat_interleave(k1, dim=1)
        bce = F.binary_cross_entropy_with_logits(z, label, reduction="none") * mask
        dz = (torch.sigmoid(z) - label) * mask / k1

        # ---- backward, per sample
        dgm = dz.unsqueeze(2) * wp[..., :g_dim]
        grad_p = dgm * ugc.unsqueeze(1)  # item GMF row gradient per sample
        da = dz.unsqueeze(2) * wp[..., g_dim:] * (pre[-1] > 0)
        deltas = [da]
        for k in range(self.n_layers - 1, 0, -1):
            da = (da @ weights[k]) * (pre[k - 1] > 0)
            deltas.insert(0, da)
        grad_q = deltas[0] @ w0i  # item MLP row gradient per sample
        grad_ug = (dgm * gmf_rows).view(n_rows, per_row, k1, g_dim).sum(2)
        grad_um = deltas[0].view(n_rows, per_row, k1, -1).sum(2) @ w0u  # [K, R, d_mlp]

        # ---- per-example squared norms
        def ex(x: torch.Tensor) -> torch.Tensor:  # [K, T, f] -> [E, k+1, f]
            return x.reshape(n_ex, k1, x.shape[-1])

        def gram(x: torch.Tensor) -> torch.Tensor:
            xe = ex(x).double()
            return torch.bmm(xe, xe.mT)

        sq = torch.zeros(n_ex, dtype=torch.float64, device=self.device)
        if part in ("all", "private"):
            sq += grad_ug.double().square().sum(2).view(-1)
            sq += grad_um.double().square().sum(2).view(-1)
        if part in ("all", "shared"):
            items_e = it.reshape(n_ex, k1)
            sq += embedding_rows_sq_norms(items_e, ex(grad_p))
            sq += embedding_rows_sq_norms(items_e, ex(grad_q))
            um_sq = umc.double().square().sum(1).repeat_interleave(per_row)
            sq += linear_ghost_sq_norms(gram(mlp_rows) + um_sq.view(-1, 1, 1), ex(deltas[0]))
            for k in range(1, self.n_layers):
                sq += linear_ghost_sq_norms(gram(acts[k - 1]), ex(deltas[k]))
            sq += linear_ghost_sq_norms(gram(feats), ex(dz.unsqueeze(2)))
        factor = clip_factors(sq, clip).to(self.device)
        f_ex = factor.view(n_rows, per_row, 1)
        f_slot = f_ex.expand(n_rows, per_row, k1).reshape(n_rows, t_slots, 1)

        # ---- per-client sums of clipped per-example gradients
        shared_sums = s_ug = s_um = None
        if part in ("all", "shared"):
            shared_sums = {
                _GMF: _scatter_sum((grad_p * f_slot).view(-1, g_dim), key.view(-1), m * n_items),
                _MLP: _scatter_sum((grad_q * f_slot).view(-1, d_mlp), key.view(-1), m * n_items),
            }
            scaled = [d * f_slot for d in deltas]
            s1 = scaled[0].sum(1)
            shared_sums["mlp.0.weight"] = _seg(
                torch.cat(
                    [s1.unsqueeze(2) * umc.unsqueeze(1), torch.bmm(scaled[0].mT, mlp_rows)],
                    dim=2,
                ),
                cc,
                m,
            )
            shared_sums["mlp.0.bias"] = _seg(s1, cc, m)
            for k in range(1, self.n_layers):
                shared_sums[f"mlp.{k}.weight"] = _seg(torch.bmm(scaled[k].mT, acts[k - 1]), cc, m)
                shared_sums[f"mlp.{k}.bias"] = _seg(scaled[k].sum(1), cc, m)
            dzs = dz.unsqueeze(2) * f_slot
            shared_sums["predict.weight"] = _seg(torch.bmm(dzs.mT, feats), cc, m)
            shared_sums["predict.bias"] = _seg(dzs.sum(1), cc, m)
            shared_sums = {
                name: t.view(m, *shape)
                for (name, shape), t in (
                    ((n, s), shared_sums[n])
                    for n, s in zip(self.layout.names, self.layout.shapes, strict=True)
                )
            }
        if part in ("all", "private"):
            s_ug = _seg((grad_ug * f_ex).sum(1), cc, m)
            s_um = _seg((grad_um * f_ex).sum(1), cc, m)
        return _DPPass(
            loss=_seg(bce.sum(1), cc, m),
            sq_norms=sq,
            factor=factor,
            shared=shared_sums,
            user_gmf=s_ug,
            user_mlp=s_um,
        )

    def _pass(
        self,
        b: _Batch,
        ug: torch.Tensor,
        um: torch.Tensor,
        *,
        per_client: dict[str, torch.Tensor] | None,
        gmf_rows: torch.Tensor,
        table: torch.Tensor | None = None,
        mlp_rows: torch.Tensor | None = None,
        want_shared: bool = True,
    ) -> _Pass:
        """Forward and backward of every client's chunked loss, gradients kept per client.

        Args:
            b: The round's batch.
            ug, um: Private embeddings of the participants, ``[m, gmf_dim]``, ``[m, mlp_dim]``.
            per_client: ``None`` to use the shared dense parameters for every client, else
                per-client copies ``name -> [m, *shape]`` (the SAM-perturbed point).
            gmf_rows: GMF item embedding of every slot, ``[K, S, gmf_dim]``.
            table: With shared parameters: ``Q @ W_1i^T + b_1`` per item, ``[n_items, h_1]``.
            mlp_rows: With per-client parameters: MLP item embedding of every slot.
            want_shared: Whether to compute the gradients of the shared parameters.
        """
        cfg = self.config
        m, cc = b.m, b.chunk_client
        d_mlp = cfg.mlp_dim
        shared = per_client is None
        prm = self.shared if per_client is None else per_client

        def chunked(t: torch.Tensor) -> torch.Tensor:  # per-client [m, ...] -> per-chunk [K, ...]
            return _take(t, cc)

        # Per-layer weights: shared [out, in] or per chunk [K, out, in].
        weights = [prm[f"mlp.{k}.weight"] for k in range(self.n_layers)]
        biases = [prm[f"mlp.{k}.bias"] for k in range(self.n_layers)]
        w1u = weights[0][..., :d_mlp]
        w1i = weights[0][..., d_mlp:]
        wp = prm["predict.weight"][..., 0, :]
        wp_g, wp_m = wp[..., : cfg.gmf_dim], wp[..., cfg.gmf_dim :]
        bp = prm["predict.bias"][..., 0]

        def lin(x: torch.Tensor, k: int) -> torch.Tensor:
            w = weights[k] if shared else wk_chunk[k]
            out = x @ w.transpose(-1, -2)
            return out + (biases[k] if shared else chunked(biases[k]).unsqueeze(1))

        # ---- forward
        if shared:
            wk_chunk: list[torch.Tensor] = []
            assert table is not None
            a_user = um @ w1u.T  # [m, h1]
            a = chunked(a_user).unsqueeze(1) + _take(table, b.item)
        else:
            assert mlp_rows is not None
            # Layer 1: only the item half per chunk, [K, h1, d_mlp]; the user half is per client.
            wk_chunk = [chunked(w1i)] + [chunked(w) for w in weights[1:]]
            a_user = torch.bmm(w1u, um.unsqueeze(2)).squeeze(2) + biases[0]  # [m, h1]
            a = chunked(a_user).unsqueeze(1) + mlp_rows @ wk_chunk[0].transpose(1, 2)
        pre = [a]
        acts = [torch.relu(a)]
        for k in range(1, self.n_layers):
            pre.append(lin(acts[-1], k))
            acts.append(torch.relu(pre[-1]))
        ug_c = chunked(ug).unsqueeze(1)
        gm = ug_c * gmf_rows  # [K, S, gmf]
        if shared:
            z = gm @ wp_g + acts[-1] @ wp_m + bp
        else:
            z = (
                (gm * chunked(wp_g).unsqueeze(1)).sum(-1)
                + (acts[-1] * chunked(wp_m).unsqueeze(1)).sum(-1)
                + chunked(bp).unsqueeze(1)
            )
        loss = F.binary_cross_entropy_with_logits(z, b.label, reduction="none") * b.weight
        loss_c = _seg(loss.sum(1), cc, m)
        dz = (torch.sigmoid(z) - b.label) * b.weight  # [K, S]

        # ---- backward
        wpg_b = wp_g if shared else chunked(wp_g).unsqueeze(1)
        wpm_b = wp_m if shared else chunked(wp_m).unsqueeze(1)
        dgm = dz.unsqueeze(2) * wpg_b
        d_ug = _seg((dgm * gmf_rows).sum(1), cc, m)
        da = (dz.unsqueeze(2) * wpm_b) * (pre[-1] > 0)
        dense: dict[str, torch.Tensor] = {}
        for k in range(self.n_layers - 1, 0, -1):
            if want_shared:
                dense[f"mlp.{k}.weight"] = _seg(torch.bmm(da.transpose(1, 2), acts[k - 1]), cc, m)
                dense[f"mlp.{k}.bias"] = _seg(da.sum(1), cc, m)
            w = weights[k] if shared else wk_chunk[k]
            da = (da @ w) * (pre[k - 1] > 0)
        s1 = _seg(da.sum(1), cc, m)  # [m, h1]: per-client sum of d a_1
        d_um = s1 @ w1u if shared else torch.bmm(s1.unsqueeze(1), w1u).squeeze(1)
        pair_gmf = pair_mlp = None
        if want_shared:
            rows = mlp_rows if mlp_rows is not None else _take(self.shared[_MLP], b.item)
            d_w1i = _seg(torch.bmm(da.transpose(1, 2), rows), cc, m)
            d_w1u = s1.unsqueeze(2) * um.unsqueeze(1)
            dense["mlp.0.weight"] = torch.cat([d_w1u, d_w1i], dim=2)
            dense["mlp.0.bias"] = s1
            feats = torch.cat([gm, acts[-1]], dim=2)
            dense["predict.weight"] = _seg(torch.bmm(dz.unsqueeze(1), feats), cc, m)
            dense["predict.bias"] = _seg(dz.sum(1, keepdim=True), cc, m)
            d_rows_mlp = da @ (w1i if shared else wk_chunk[0])
            n_pairs = b.pair_client.shape[0]
            flat = b.pair.reshape(-1)
            pair_gmf = _scatter_sum((dgm * ug_c).reshape(-1, cfg.gmf_dim), flat, n_pairs)
            pair_mlp = _scatter_sum(d_rows_mlp.reshape(-1, d_mlp), flat, n_pairs)
            dense = {name: dense[name] for name in self.layout.names[2:]}
        return _Pass(
            loss=loss_c,
            d_user_gmf=d_ug,
            d_user_mlp=d_um,
            dense=dense if want_shared else None,
            pair_gmf=pair_gmf,
            pair_mlp=pair_mlp,
        )

    def apply_aggregate(self, aggregate: Aggregate, round_index: int) -> None:
        """Server step: one Adam step (``server_lr``) with the mean gradient as ``.grad``."""
        mean = aggregate.mean
        if mean.shape != (self.layout.size,):
            raise ConfigError(
                f"aggregate must be a flat vector of {self.layout.size} floats, "
                f"got shape {tuple(mean.shape)}"
            )
        grads = self.layout.split(mean.to(device=self.device, dtype=torch.float32))
        self._server_step += 1
        for name, param in self.shared.items():
            _adam_(
                param,
                grads[name],
                self._server_exp_avg[name],
                self._server_exp_avg_sq[name],
                self._server_step,
                self.config.server_lr,
            )

    def end_round(self, round_index: int) -> None:
        """Nothing to do: FedRecGEL has no schedules."""

    # ------------------------------------------------------------------ scoring
    def _check_users(self, users: torch.Tensor, what: str) -> torch.Tensor:
        users = users.to(torch.long).cpu().reshape(-1)
        if users.numel() and (int(users.min()) < 0 or int(users.max()) >= self.split.n_users):
            raise ConfigError(f"{what} must be user indices in [0, {self.split.n_users})")
        return users

    @torch.no_grad()
    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, K]`` of ``items[b]`` for ``users[b]`` (each user's private embeddings)."""
        users = users.to(self.device, torch.long)
        items = items.to(self.device, torch.long)
        cfg = self.config
        table = self._item_table()
        block = max(1, (1 << 22) // max(1, items.shape[1] * cfg.layers[1]))
        out = [
            self._logits(users[i : i + block], items[i : i + block], table)
            for i in range(0, users.shape[0], block)
        ]
        return torch.cat(out) if out else torch.zeros(0, items.shape[1], device=self.device)

    @torch.no_grad()
    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, n_items]`` of every item for each user."""
        users = users.to(self.device, torch.long)
        items = torch.arange(self.split.n_items, device=self.device)
        return self.score(users, items.expand(users.shape[0], -1))

    def _item_table(self) -> torch.Tensor:
        """The item half of the tower's first layer for every item, ``E_mlp W1_item^T + b1``
        ``[n_items, layers[1]]``, computed once per state of the three tensors it reads (an
        evaluation scores hundreds of user batches against one model)."""
        cfg, sh = self.config, self.shared
        inputs = (sh[_MLP], sh["mlp.0.weight"], sh["mlp.0.bias"])
        cached = self._table_cache
        if cached is not None and all(
            t is c and t._version == v for t, c, v in zip(inputs, cached[0], cached[1], strict=True)
        ):
            return cached[2]
        emb, w1, b1 = inputs
        table = emb @ w1[:, cfg.mlp_dim :].T + b1
        # The inputs are held, so their ids stay theirs while the cache refers to them.
        self._table_cache = (inputs, tuple(t._version for t in inputs), table)
        return table

    @torch.no_grad()
    def score_block(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, C]`` of the same items ``[C]`` for every user: full-ranking evaluation
        in blocks (:mod:`securefed.evaluation`), the tower's first layer factored per user
        and per item and the pairs run through the rest in slabs of about 2**16 rows."""
        users = users.to(self.device, torch.long)
        items = items.to(self.device, torch.long)
        cfg, sh = self.config, self.shared
        table = self._item_table()[items]
        user_part = self.user_mlp[users] @ sh["mlp.0.weight"][:, : cfg.mlp_dim].T
        wp = sh["predict.weight"][0]
        out = self.user_gmf[users] @ (sh[_GMF][items] * wp[: cfg.gmf_dim]).T
        out += sh["predict.bias"]
        n_items = int(items.numel())
        step = max(1, (1 << 16) // max(1, n_items))
        for lo in range(0, users.shape[0], step):
            hi = min(users.shape[0], lo + step)
            h = (user_part[lo:hi, None, :] + table[None]).relu_().reshape(-1, table.shape[1])
            for k in range(1, self.n_layers):
                h = torch.addmm(sh[f"mlp.{k}.bias"], h, sh[f"mlp.{k}.weight"].T).relu_()
            out[lo:hi] += (h @ wp[cfg.gmf_dim :]).reshape(hi - lo, n_items)
        return out

    def _logits(
        self, users: torch.Tensor, items: torch.Tensor, table: torch.Tensor
    ) -> torch.Tensor:
        cfg, sh = self.config, self.shared
        w1u = sh["mlp.0.weight"][:, : cfg.mlp_dim]
        a = (self.user_mlp[users] @ w1u.T).unsqueeze(1) + table[items]
        h = torch.relu(a)
        for k in range(1, self.n_layers):
            h = torch.relu(h @ sh[f"mlp.{k}.weight"].T + sh[f"mlp.{k}.bias"])
        wp = sh["predict.weight"][0]
        gm = self.user_gmf[users].unsqueeze(1) * sh[_GMF][items]
        return gm @ wp[: cfg.gmf_dim] + h @ wp[cfg.gmf_dim :] + sh["predict.bias"]

    # ------------------------------------------------------------------ state
    def global_parameters(self) -> dict[str, torch.Tensor]:
        """The shared parameters every participant receives (named as in ``layout``)."""
        return dict(self.shared)

    def set_global_parameters(self, tensors: dict[str, torch.Tensor]) -> None:
        """Install the server's shared parameters (a node receiving the round's model)."""
        self.shared = {k: t.to(self.device, torch.float32).clone() for k, t in tensors.items()}

    def train_subset(
        self, plan: RoundPlan, keep: torch.Tensor, round_index: int
    ) -> tuple[FedRecGELUpdates, RoundStats]:
        """Train the participants at positions ``keep`` of a plan drawn for a whole cohort."""
        m = plan.participants.shape[0]
        remap = torch.full((m,), -1, dtype=torch.long)
        remap[keep] = torch.arange(keep.shape[0])
        sample_keep = remap[plan.sample_client] >= 0
        sub = RoundPlan(
            participants=plan.participants[keep],
            sample_client=remap[plan.sample_client[sample_keep]],
            sample_item=plan.sample_item[sample_keep],
            sample_label=plan.sample_label[sample_keep],
            samples_per_client=plan.samples_per_client[keep],
        )
        return self.train_plan(sub, round_index)

    def state_dict(self) -> dict[str, Any]:
        """Shared parameters, private embeddings and every Adam state (server and clients)."""
        return {
            "config": asdict(self.config),
            "shared": {k: v.clone() for k, v in self.shared.items()},
            "user_gmf": self.user_gmf.clone(),
            "user_mlp": self.user_mlp.clone(),
            "client_adam": {k: v.clone() for k, v in self._client_adam.items()},
            "server_adam": {
                "step": self._server_step,
                "exp_avg": {k: v.clone() for k, v in self._server_exp_avg.items()},
                "exp_avg_sq": {k: v.clone() for k, v in self._server_exp_avg_sq.items()},
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; validates every tensor before changing anything."""
        expected = self.state_dict()
        try:
            checks = [
                *[(f"shared.{k}", state["shared"][k], v) for k, v in expected["shared"].items()],
                ("user_gmf", state["user_gmf"], self.user_gmf),
                ("user_mlp", state["user_mlp"], self.user_mlp),
                *[
                    (f"client_adam.{k}", state["client_adam"][k], v)
                    for k, v in self._client_adam.items()
                ],
                *[
                    (f"server_adam.{part}.{k}", state["server_adam"][part][k], v)
                    for part in ("exp_avg", "exp_avg_sq")
                    for k, v in self.shared.items()
                ],
            ]
            server_step = int(state["server_adam"]["step"])
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not a FedRecGEL state dict: missing entry {exc}") from exc
        for name, got, want in checks:
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                raise ConfigError(
                    f"state entry {name} must have shape {tuple(want.shape)}, got {shape}; "
                    "was it saved from a model with the same data and config?"
                )
        self.shared = {
            k: state["shared"][k].to(self.device, torch.float32).clone() for k in self.shared
        }
        self.user_gmf = state["user_gmf"].to(self.device, torch.float32).clone()
        self.user_mlp = state["user_mlp"].to(self.device, torch.float32).clone()
        self._client_adam = {
            k: state["client_adam"][k].to(self.device, v.dtype).clone()
            for k, v in self._client_adam.items()
        }
        self._server_step = server_step
        self._server_exp_avg = {
            k: state["server_adam"]["exp_avg"][k].to(self.device, torch.float32).clone()
            for k in self.shared
        }
        self._server_exp_avg_sq = {
            k: state["server_adam"]["exp_avg_sq"][k].to(self.device, torch.float32).clone()
            for k in self.shared
        }


# ---------------------------------------------------------------------- registry entry
def _item_rows(
    flat: torch.Tensor, global_before: dict[str, torch.Tensor], n_items: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """GMF and MLP item-embedding gradient rows concatenated; the GMF rows are collinear with
    ``w_p,gmf * p_u`` (the ratio rows)."""
    c = flat.shape[0]
    gmf = global_before[_GMF].shape[1]
    mlp = global_before[_MLP].shape[1]
    g = flat[:, : n_items * gmf].view(c, n_items, gmf)
    m = flat[:, n_items * gmf : n_items * (gmf + mlp)].view(c, n_items, mlp)
    return torch.cat([g, m], dim=2), g


def _truth_direction(private: torch.Tensor, gb: dict[str, torch.Tensor]) -> torch.Tensor:
    """A positive's gradient on its GMF row is along ``-(w_p,gmf * p_u)``."""
    wp = gb["predict.weight"][0, : private.shape[1]]
    return -(private * wp)


def _recovered(direction: torch.Tensor, gb: dict[str, torch.Tensor]) -> torch.Tensor:
    wp = gb["predict.weight"][0, : direction.shape[1]]
    return -direction * wp / (wp * wp + 1e-8)


def _layout_size(p: FedRecGELConfig, split: Split) -> int:
    widths = p.layers
    size = split.n_items * (p.gmf_dim + p.mlp_dim)
    for k in range(len(widths) - 1):
        size += widths[k + 1] * widths[k] + widths[k + 1]
    return size + p.gmf_dim + widths[-1] + 1


# ---------------------------------------------------------------------------- costs

#: Rates on the development machine (securefed.costs scales them to the machine at hand), in
#: seconds: per sample x MLP multiply-add x pass in training; per user x item x MLP
#: multiply-add scored.
MLP_SECONDS = 6.5e-11
MLP_EVAL_SECONDS = 5.5e-11


def _state_bytes(p: FedRecGELConfig, shape: RunShape, written_rows: int | None) -> dict[str, int]:
    """The bytes of :meth:`FedRecGEL.state_dict`'s tensors (the Adam states summed under
    ``client_adam`` and ``server_adam``)."""
    u, i = shape.users, shape.items
    widths = tuple(p.layers)
    shared = i * (p.gmf_dim + p.mlp_dim)
    for k in range(len(widths) - 1):
        shared += widths[k + 1] * widths[k] + widths[k + 1]
    shared += p.gmf_dim + widths[-1] + 1
    return {
        "shared": shared * 4,
        "user_gmf": u * p.gmf_dim * 4,
        "user_mlp": u * p.mlp_dim * 4,
        "client_adam": 2 * u * (p.gmf_dim + p.mlp_dim) * 4 + u * 8,
        "server_adam": 2 * shared * 4,
    }


def _work(inputs: CostInputs) -> ModelWork:
    p = inputs.config.params
    u, i, m, samples = inputs.shape.users, inputs.shape.items, inputs.participants, inputs.samples
    widths = tuple(p.layers)
    layers = sum(widths[k] * widths[k + 1] for k in range(len(widths) - 1))
    passes = 3 if p.sam else 1
    tower = sum(widths[k] * widths[k + 1] for k in range(1, len(widths) - 1)) + widths[0]
    # score_all returns [EVAL_BLOCK, items] scores (and evaluation masks them), scoring
    # max(1, 2^22 // (items x widths[1])) users at a time through the tower (the gathered
    # first layer, its sum and ReLU, then every later layer and the GMF product). Gowalla at
    # 10 %: 2.63 GB peak RSS measured, 2.62 GB estimated (training dominates).
    block = max(1, (1 << 22) // max(1, i * widths[1]))
    acts = 3 * widths[1] + sum(widths[2:]) + p.gmf_dim
    return ModelWork(
        round_seconds=MLP_SECONDS * samples * (layers + p.gmf_dim) * passes * p.local_steps,
        # Blocks of 2^15 sample slots through the tower (activations and their gradients),
        # plus the structured uploads and the per-client dense MLP gradients.
        round_bytes=int(
            (1 << 15) * sum(widths) * 4 * 6
            + samples * (p.gmf_dim + p.mlp_dim) * 4 * 2
            + m * layers * 4 * 2
        ),
        # The dense pass: an upper bound, since full ranking runs in item blocks with early
        # exit (FedRecGEL.score_block; on Gowalla 1.7 % of the pairs for a model at full HR@10
        # 0.007, docs/benchmarks.md); the cost depends on the model, so a run's later
        # estimates take the measured evaluation time.
        full_eval_seconds=MLP_EVAL_SECONDS * u * i * tower,
        eval_seconds=MLP_EVAL_SECONDS * u * 200 * tower,
        eval_bytes=EVAL_BLOCK * i * 5 + block * i * 4 * acts,
    )


SPEC = ModelSpec(
    name="fedrecgel",
    title="FedRecGEL: sharpness-aware shared item embeddings (arXiv 2603.11503)",
    params=FedRecGELConfig,
    build=FedRecGEL,
    default_rounds=100,
    # The paper's cohort: a uniform 10 % of the clients every round.
    cohort=lambda n_users: CohortSpec(kind="fixed", size=max(1, int(0.1 * n_users))),
    full_eval_every=10,
    # Measured update norms on MovieLens 100K: FedRecGEL's gradient ~1.
    dp_clip=1.0,
    # About half the median per-example norm of the base gradient at initialisation (0.39).
    example_clip=0.2,
    interaction_releases=lambda p: (
        p.local_steps * sam_releases(sam=p.sam, rho_shared=p.rho_shared, rho_private=p.rho_private)
    ),
    layout_size=_layout_size,
    cli_params={"dim": "gmf_dim"},
    private_state=("user_gmf", "user_mlp", "client_adam"),
    streams_uploads=True,
    observer=ObserverHooks(
        item_rows=_item_rows,
        private_vectors=lambda model: model.user_gmf.detach().cpu().clone(),
        truth_direction=_truth_direction,
        recovered_embedding=_recovered,
        ratio_width=lambda gb: int(gb[_GMF].shape[1]),
    ),
    # --private-prior (securefed.prior): the released counts enter the scores in units of
    # their noise std, at the weight chosen on MovieLens 100K validation at epsilon 2
    # (benchmarks/prior_scale.py; docs/privacy.md).
    prior_weight=0.3,
    prior_scale="noise",
    # The private mode's settings: share 0.9 and weight chosen on MovieLens 100K validation,
    # 10 rounds of Poisson cohorts at rate 0.1 as in every table of docs/privacy.md's "Private
    # FedRAP and FedRecGEL" (not tuned further).
    private_mode=PrivateMode(prior_share=0.9, rounds=10, client_fraction=0.1),
    costs=ModelCosts(state=_state_bytes, work=_work, released=("shared",)),
)
