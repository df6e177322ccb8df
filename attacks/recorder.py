"""The round observer of an audit: turns each round into what the chosen attacks need.

Recording every upload of every round is large (FedRAP on MovieLens 100K: 943 clients x 54k
floats per round), so the recorder keeps only running per-(user, item) statistics in memory
and streams to ``record/`` per round only what a later step needs: the round's participants,
the canary scores, the aggregate's row statistic, and (once) the uploads of the few targets
of the optimisation inversion. :attr:`AttackRecorder.bytes_written` says how much that was.
The IMIA shadow attack (:mod:`attacks.imia`) runs online on each real user's first observed
upload and keeps only its per-(user, item) scores; the released-model attack needs nothing
per round (the audit saves the final global model once).

Private parameters (FedRAP's scorer ``w_u``, FedRecGEL's ``p_u``) are read only to *score*
the inversion (cosine to the truth) and to build the auditor's canary test direction (the
auditor owns its canaries); no attack reads them.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.canaries import Canaries
from attacks.imia import IMIAObservation, imia_scores, make_shadow
from attacks.registry import recorder_groups
from attacks.rows import item_rows, row_stats, touched_mask
from attacks.threat import UploadChannel
from protocols.dp import clip_scales
from protocols.seeding import torch_generator
from securefed.federation.aggregation import null_out
from securefed.models.registry import get_spec

__all__ = [
    "RECORDING_VERSION",
    "RECORDER_TABLES",
    "AttackRecorder",
    "RecordPlan",
    "recorded_groups",
    "recorder_bytes",
    "recorder_tables",
]

#: What an audit recording's statistics mean: written into a kept recording's metadata and
#: required by ``audit --run`` to rescore it (a recording made by other statistic code would
#: be scored as if it were this one's). Raise it whenever what the recorder accumulates, or
#: how a canary's score is computed, changes. 1: every recording before 2026-12-06 (which
#: wrote none); 2: the item-row canary test with co-occurrence rows and pair canaries, as of
#: 2026-12-06; 3: zero-out user canaries (every canary client in the run, the absent ones
#: null: :func:`attacks.canaries.plant_canaries`), later the same day.
RECORDING_VERSION = 3

#: The ``[users, items]`` float32 tables the recorder keeps, by what the attacks read
#: (:attr:`attacks.registry.AttackSpec.reads`). A table no chosen attack reads is not held.
RECORDER_TABLES: dict[str, tuple[str, ...]] = {
    "upload": ("first_change", "first_label", "change_sum", "touched_count", "label_sum"),
    "differencing": ("diff_change", "diff_label"),
    "union": ("union_sum",),
    "imia": ("imia_score",),
}
#: What only an observer of the per-client uploads can record.
_UPLOAD_GROUPS = frozenset({"upload", "imia", "targets"})


def recorder_tables(attacks: frozenset[str] | set[str], *, upload: bool) -> tuple[str, ...]:
    """The ``[users, items]`` tables a recorder of ``attacks`` holds (``upload``: the run's
    uploads are observable, i.e. an upload channel exists)."""
    groups = recorded_groups(attacks, upload=upload)
    return tuple(t for g, tables in RECORDER_TABLES.items() if g in groups for t in tables)


def recorded_groups(attacks: frozenset[str] | set[str], *, upload: bool) -> frozenset[str]:
    """What a recorder of ``attacks`` keeps (:data:`attacks.registry.RecorderGroup`): what
    they read, less what needs the uploads where none is observable."""
    groups = recorder_groups(attacks)
    return groups if upload else groups - _UPLOAD_GROUPS


def recorder_bytes(
    attacks: frozenset[str] | set[str], n_users: int, n_items: int, *, upload: bool
) -> int:
    """Memory the recorder's ``[users, items]`` float32 tables take (the rest is per user)."""
    return len(recorder_tables(attacks, upload=upload)) * n_users * n_items * 4


@dataclass(frozen=True, kw_only=True)
class RecordPlan:
    """What to record: the chosen attacks and how the observers see the run."""

    attacks: frozenset[str]
    model: str
    n_users: int
    n_items: int
    upload: UploadChannel | None
    sum_noise_std: float
    clip: float | None
    canaries: Canaries | None
    initial_private: torch.Tensor
    seed: int
    target_users: int = 16
    cohort_sizes: tuple[int, ...] = (1, 2, 5, 10, 20, 50, 100)
    chunk: int = 64
    real_users: int | None = None
    imia_iterations: int = 5


@dataclass
class _Acc:
    first_round: np.ndarray
    first_label_round: np.ndarray
    first_change: np.ndarray
    first_label: np.ndarray
    change_sum: np.ndarray
    touched_count: np.ndarray
    label_sum: np.ndarray
    observed: np.ndarray
    cos_direction: np.ndarray
    cos_embedding: np.ndarray
    diff_change: np.ndarray
    diff_label: np.ndarray
    union_sum: np.ndarray
    union_obs: np.ndarray
    canary_score: np.ndarray
    imia_score: np.ndarray
    imia_round: np.ndarray
    union_by_k: dict[int, dict[str, Any]] = field(default_factory=dict)
    targets: list[int] = field(default_factory=list)


def faithful_updates(view: Any) -> Any:
    """The round's uploads as they left the clients.

    Some update types refer to server state that the server step then changes (FedRAP's
    keeps a reference to ``C``), so ``dense()``/``norms()`` read after the round would describe
    uploads against the *new* state; the model's ``observer.upload_against`` rebuilds them
    against the round's public state (``global_before``).
    """
    spec = get_spec(view.config.model)
    against = spec.observer.upload_against if spec.observer is not None else None
    return view.updates if against is None else against(view.updates, view.global_before)


class AttackRecorder:
    """A :class:`securefed.training.RoundObserver` that accumulates attack statistics."""

    def __init__(self, plan: RecordPlan, out_dir: Path) -> None:
        self.plan = plan
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bytes_written = 0
        self.rounds = 0
        u, i = plan.n_users, plan.n_items
        m = plan.canaries.size if plan.canaries is not None else 0
        f32 = np.float32
        self._groups = recorded_groups(plan.attacks, upload=plan.upload is not None)
        held = set(recorder_tables(plan.attacks, upload=plan.upload is not None))

        def table(name: str, fill: float) -> np.ndarray:
            # [users, items] when a chosen attack reads it, else empty (never read).
            return np.full((u, i) if name in held else (0, 0), fill, dtype=f32)

        nan = float("nan")
        self.acc = _Acc(
            first_round=np.full(u, -1, dtype=np.int64),
            first_label_round=np.full(u, -1, dtype=np.int64),
            first_change=table("first_change", nan),
            first_label=table("first_label", nan),
            change_sum=table("change_sum", 0.0),
            touched_count=table("touched_count", 0.0),
            label_sum=table("label_sum", 0.0),
            observed=np.zeros(u, dtype=np.int64),
            cos_direction=np.full(u, np.nan),
            cos_embedding=np.full(u, np.nan),
            diff_change=table("diff_change", nan),
            diff_label=table("diff_label", nan),
            union_sum=table("union_sum", 0.0),
            union_obs=np.zeros(u, dtype=np.int64),
            canary_score=np.zeros(m),
            imia_score=table("imia_score", nan),
            imia_round=np.full(u, -1, dtype=np.int64),
        )
        # Private state before each round, for scoring only (see the module docstring).
        self._private = plan.initial_private.clone()
        # The upload attacks' rounds run exactly when their tables are held.
        self._wants_upload = "upload" in self._groups
        self._wants_imia = "imia" in self._groups
        self._absent: dict[int, torch.Tensor] = {}
        # Canaries seen in an earlier round (FedRAP flips the sign of their own-row push).
        self._canary_seen: torch.Tensor | None = None

    # ------------------------------------------------------------------ streaming
    def _write(self, name: str, **arrays: Any) -> None:
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        data = buf.getvalue()
        (self.dir / name).write_bytes(data)
        self.bytes_written += len(data)

    def write_torch(self, name: str, obj: Any) -> None:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
        (self.dir / name).write_bytes(data)
        self.bytes_written += len(data)

    # ------------------------------------------------------------------ one round
    def __call__(self, view: Any) -> None:
        plan = self.plan
        r = int(view.round_index)
        updates = faithful_updates(view)
        # Upload rows follow ``updates.clients`` (FedRAP reorders participants by batch count).
        clients = updates.clients.to(torch.long).cpu()
        norms = updates.norms() if len(updates) else torch.zeros(0, dtype=torch.float64)
        record: dict[str, Any] = {"participants": clients.numpy()}
        if len(updates) and self._wants_upload:
            self._upload_round(r, view, updates, clients, norms)
        if len(updates) and self._wants_imia:
            self._imia_round(r, view, updates, clients, norms)
        if len(updates) and "differencing" in self._groups and r == 0:
            self._differencing(view, updates, clients, norms)
        if len(updates) and "union" in self._groups and r == 0:
            self._union_by_cohort(view, updates, clients, norms)
        if view.aggregate is not None and len(updates):
            if "union" in self._groups:
                record["aggregate_change"] = self._union_round(view, clients).astype(np.float32)
            if plan.canaries is not None:
                record["canary_score"] = self._canary_round(view, updates, clients, norms)
        self._write(f"round_{r:04d}.npz", **record)
        self._private[clients] = self._read_private(view.model)[clients]
        self.rounds += 1

    def _absent_directions(self, k: int) -> torch.Tensor:
        """One fixed random direction per canary for each width ``k`` the test reads (the
        width changes between rounds where a model releases more coordinates of an item in
        some rounds: fedals's co-occurrence rounds)."""
        if k not in self._absent:
            assert self.plan.canaries is not None
            path: tuple[str | int, ...] = ("audit-canary-direction",)
            if self._absent:  # the first width keeps the stream it always had
                path += (k,)
            gen = torch_generator(self.plan.seed, *path)
            self._absent[k] = torch.randn(self.plan.canaries.size, k, generator=gen)
        return self._absent[k]

    def _read_private(self, model: Any) -> torch.Tensor:
        return self._hooks.private_vectors(model)

    def _truth_direction(self, view: Any, users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(true direction of the ratio rows, true embedding) for scoring only."""
        emb = self._private[users]
        return self._hooks.truth_direction(emb, view.global_before), emb

    def _recovered_embedding(self, view: Any, direction: torch.Tensor) -> torch.Tensor:
        return self._hooks.recovered_embedding(direction, view.global_before)

    @property
    def _hooks(self) -> Any:
        from attacks.rows import observer_hooks

        return observer_hooks(self.plan.model)

    def _canary_rows(self, flat: torch.Tensor, view: Any, n_tot: int) -> torch.Tensor:
        """``[c, n_tot, k]``: the coordinates of each item that the canary test reads (the
        model's ``canary_rows``; by default its ratio rows, the layout's first coordinates)."""
        hooks = self._hooks
        if hooks.canary_rows is not None:
            return hooks.canary_rows(flat, view.global_before, n_tot)
        k = hooks.ratio_width(view.global_before)
        return flat[:, : n_tot * k].view(flat.shape[0], n_tot, k)

    def _upload_round(
        self, r: int, view: Any, updates: Any, clients: torch.Tensor, norms: torch.Tensor
    ) -> None:
        plan = self.plan
        assert plan.upload is not None
        acc = self.acc
        gen = torch_generator(plan.seed, "audit-observer-share", r)
        m = len(updates)
        n_real = plan.n_items
        targets_left = plan.target_users - len(acc.targets)
        for lo in range(0, m, plan.chunk):
            rows = torch.arange(lo, min(m, lo + plan.chunk))
            users = clients[rows]
            flat = plan.upload.observe(updates, rows, norms, generator=gen)
            res, ratio = item_rows(plan.model, flat, view.global_before, _total_items(view, plan))
            st = row_stats(
                res[:, :n_real],
                ratio[:, :n_real],
                noise_std=plan.upload.share_std,
                positives_minority=self._hooks.positives_minority,
            )
            un = users.numpy()
            change = st.change.numpy()
            scale = change.mean(1, keepdims=True) + 1e-30
            acc.change_sum[un] += change / scale
            acc.touched_count[un] += st.touched.numpy()
            acc.label_sum[un] += st.label.numpy() / (
                np.abs(st.label.numpy()).mean(1, keepdims=True) + 1e-30
            )
            acc.observed[un] += 1
            first = acc.first_round[un] < 0
            if bool(first.any()):
                fu = un[first]
                acc.first_round[fu] = r
                acc.first_change[fu] = change[first]
            # The inversion reads each user's first upload that carries its private direction
            # (every upload but a fedals count round's, whose ratio rows are all zero).
            ratio_change = ratio[:, :n_real].double().square().sum(-1)
            carries = touched_mask(ratio_change, ratio.shape[-1], noise_std=0.0).any(1).numpy()
            first = (acc.first_label_round[un] < 0) & carries
            if bool(first.any()):
                fu = un[first]
                acc.first_label_round[fu] = r
                acc.first_label[fu] = st.label.numpy()[first]
                truth_dir, truth_emb = self._truth_direction(view, users[torch.from_numpy(first)])
                rec_dir = st.direction[torch.from_numpy(first)]
                acc.cos_direction[fu] = torch.nn.functional.cosine_similarity(
                    rec_dir, truth_dir, dim=1
                ).numpy()
                rec_emb = self._recovered_embedding(view, rec_dir)
                acc.cos_embedding[fu] = torch.nn.functional.cosine_similarity(
                    rec_emb, truth_emb, dim=1
                ).numpy()
                if "targets" in self._groups and targets_left > 0:
                    # Real users only: a canary client is the auditor's own, and its row
                    # is not in the score matrices.
                    real = plan.real_users if plan.real_users is not None else plan.n_users
                    pick = np.nonzero(first & (un < real))[0][:targets_left]
                    for j in pick:
                        u = int(un[j])
                        self.write_torch(
                            f"target_{u}.pt",
                            {
                                "user": u,
                                "round": r,
                                "upload": flat[j].clone(),
                                "global_before": {
                                    k: v.clone() for k, v in view.global_before.items()
                                },
                                "n_items": _total_items(view, plan),
                                # scoring only: never read by the attack
                                "truth_embedding": self._private[u].clone(),
                            },
                        )
                        acc.targets.append(u)
                    targets_left -= len(pick)

    def _imia_round(
        self, r: int, view: Any, updates: Any, clients: torch.Tensor, norms: torch.Tensor
    ) -> None:
        """IMIA on the first observed upload of every real user in this round (batched)."""
        plan = self.plan
        assert plan.upload is not None
        acc = self.acc
        real = plan.real_users if plan.real_users is not None else plan.n_users
        un = clients.numpy()
        fresh = torch.from_numpy((acc.imia_round[un] < 0) & (un < real))
        rows_all = torch.nonzero(fresh).squeeze(1)
        if rows_all.numel() == 0:
            return
        n_tot = _total_items(view, plan)
        gen = torch_generator(plan.seed, "audit-imia-share", r)
        pcs, pis, obs_rows = [], [], []
        for lo in range(0, rows_all.shape[0], plan.chunk):
            rows = rows_all[lo : lo + plan.chunk]
            flat = plan.upload.observe(updates, rows, norms, generator=gen)
            res, _ = item_rows(plan.model, flat, view.global_before, n_tot)
            change = res.double().square().sum(-1)
            touched = touched_mask(change, res.shape[-1], noise_std=plan.upload.share_std)
            c_local, item = torch.nonzero(touched, as_tuple=True)
            pcs.append(c_local + lo)
            pis.append(item)
            obs_rows.append(res[c_local, item])
        users = clients[rows_all]
        obs = IMIAObservation(
            users=users,
            pair_client=torch.cat(pcs),
            pair_item=torch.cat(pis),
            rows=torch.cat(obs_rows),
        )
        shadow = make_shadow(
            plan.model,
            view.model.split,
            view.config,
            view.global_before,
            r,
            users,
            torch_generator(plan.seed, "audit-imia-shadow", r),
        )
        sub = view.config.params
        scores, _ = imia_scores(
            obs,
            shadow,
            n_items=n_tot,
            num_negatives=sub.num_negatives,
            iterations=plan.imia_iterations,
            generator=torch_generator(plan.seed, "audit-imia-guess", r),
        )
        keep = obs.pair_item < plan.n_items
        at_user = users[obs.pair_client[keep]].numpy()
        acc.imia_score[at_user, obs.pair_item[keep].numpy()] = scores[keep].numpy()
        acc.imia_round[users.numpy()] = r

    def _clip_factors(self, norms: torch.Tensor, clients: torch.Tensor, view: Any) -> torch.Tensor:
        """The factors the aggregator applies: the clip's, and zero for null users (the
        zero-out canaries' absent world, :func:`securefed.federation.aggregation.null_out`)."""
        if self.plan.clip is None:
            factors = torch.ones_like(norms, dtype=torch.float32)
        else:
            factors = clip_scales(norms, self.plan.clip)
        return null_out(factors, clients, view.model.split.null_users)

    def _differencing(
        self, view: Any, updates: Any, clients: torch.Tensor, norms: torch.Tensor
    ) -> None:
        """Two releases that differ by one client: their difference is that client's clipped
        upload plus two independent draws of the sum's noise (std ``sqrt(2) sigma C``)."""
        plan = self.plan
        channel = UploadChannel(
            clip=plan.clip, share_std=float(np.sqrt(2.0)) * plan.sum_noise_std, note="differencing"
        )
        gen = torch_generator(plan.seed, "audit-differencing-noise", 0)
        m = len(updates)
        for lo in range(0, m, plan.chunk):
            rows = torch.arange(lo, min(m, lo + plan.chunk))
            flat = channel.observe(updates, rows, norms, generator=gen)
            res, ratio = item_rows(plan.model, flat, view.global_before, _total_items(view, plan))
            st = row_stats(
                res[:, : plan.n_items],
                ratio[:, : plan.n_items],
                noise_std=channel.share_std,
                positives_minority=self._hooks.positives_minority,
            )
            un = clients[rows].numpy()
            self.acc.diff_change[un] = st.change.numpy()
            self.acc.diff_label[un] = st.label.numpy()

    def _sum_rows(self, view: Any, total: torch.Tensor) -> np.ndarray:
        res, _ = item_rows(
            self.plan.model, total.unsqueeze(0), view.global_before, _total_items(view, self.plan)
        )
        return res[0, : self.plan.n_items].double().square().sum(-1).numpy()

    def _union_round(self, view: Any, clients: torch.Tensor) -> np.ndarray:
        """The aggregate observer's row statistic, scored for every participant (union leak)."""
        change = self._sum_rows(view, view.aggregate.total.to(torch.float32))
        un = clients.numpy()
        self.acc.union_sum[un] += (change / (change.mean() + 1e-30)).astype(np.float32)
        self.acc.union_obs[un] += 1
        return change

    def _union_by_cohort(
        self, view: Any, updates: Any, clients: torch.Tensor, norms: torch.Tensor
    ) -> None:
        """What a secure-aggregation server learns from the sum of a cohort of ``k`` clients:
        the union of their changed rows. Cohorts are drawn from round 0's participants; the
        sum carries the run's calibrated noise (``sigma * C``) when DP is on."""
        from attacks.metrics import binary_metrics

        plan = self.plan
        gen = torch_generator(plan.seed, "audit-union-cohorts", 0)
        factors = self._clip_factors(norms, clients, view)
        m = len(updates)
        split = view.model.split
        for k in plan.cohort_sizes:
            if k > m:
                continue
            n_cohorts = max(1, min(20, 200 // k))
            scores, labels = [], []
            for _ in range(n_cohorts):
                members = torch.randperm(m, generator=gen)[:k]
                w = torch.zeros(m)
                w[members] = factors[members]
                total = updates.weighted_sum(w)
                if plan.sum_noise_std > 0:
                    total = total + torch.randn(total.shape, generator=gen) * plan.sum_noise_std
                change = self._sum_rows(view, total)
                for j in members.tolist():
                    u = int(clients[j])
                    lab = np.zeros(plan.n_items, dtype=bool)
                    lab[split.user_train_items(u)[split.user_train_items(u) < plan.n_items]] = True
                    scores.append(change)
                    labels.append(lab)
            met = binary_metrics(np.stack(scores), np.stack(labels))
            self.acc.union_by_k[k] = {"cohorts": n_cohorts, **met.as_dict()}

    def _canary_round(
        self, view: Any, updates: Any, clients: torch.Tensor, norms: torch.Tensor
    ) -> np.ndarray:
        """Known-others test on the release: subtract every other participant's clipped
        contribution (the DP adversary knows the rest of the data), project the canary row
        on the direction a positive would push it (the auditor owns the canary client).

        Interaction canaries: the release is each host's own upload (its DP-SGD output), so
        the canary row of the host's upload is projected; other clients do not enter."""
        plan = self.plan
        can = plan.canaries
        assert can is not None
        n_tot = _total_items(view, plan)
        factors = self._clip_factors(norms, clients, view)
        position = torch.full((plan.n_users,), -1, dtype=torch.long)
        position[clients] = torch.arange(clients.shape[0])
        users = torch.from_numpy(can.users)
        items = torch.from_numpy(can.items)
        present = users >= 0
        pos = torch.full_like(users, -1)
        pos[present] = position[users[present]]
        here = pos >= 0
        hooks = self._hooks

        def extra(flat: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
            """The model's coordinates of item ``at[r]`` beyond its rows (``canary_extra``)."""
            if hooks.canary_extra is None:
                return flat.new_zeros(flat.shape[0], 0)
            return hooks.canary_extra(flat, view.global_before, at)

        empty = torch.zeros(1, updates.layout.size)
        k = self._canary_rows(empty[:0], view, n_tot).shape[-1] + extra(empty, items[:1]).shape[1]
        obs = torch.zeros(users.shape[0], k)  # each canary's own (clipped) contribution
        if bool(here.any()):
            own = updates.dense(pos[here]) * factors[pos[here]].unsqueeze(1)
            own_rows = self._canary_rows(own, view, n_tot)
            own_rows = own_rows[torch.arange(own_rows.shape[0]), items[here]]
            obs[here] = torch.cat([own_rows, extra(own, items[here])], 1).to(obs.dtype)
        own_push = obs.clone()
        if can.unit == "user":
            # Plus the residual of the release after the other participants' contributions
            # (not needed for interaction canaries, whose release is the host's upload).
            resid = view.aggregate.total.to(torch.float32) - updates.weighted_sum(factors)
            r = resid.unsqueeze(0)
            rows = self._canary_rows(r, view, n_tot)[0][items]
            obs += torch.cat([rows, extra(r.expand(items.shape[0], -1), items)], 1).to(obs.dtype)
        # Present canaries: the direction their positive pushes the coordinates (the auditor
        # owns them). Absent ones: a fixed random unit vector (their score is noise either way).
        if hooks.canary_own_direction:
            # The canary's own clipped contribution this round. Where it is zero (not in the
            # cohort; a fedals item without a factor) the random vector too, so the score is
            # the release's noise as an absent canary's: a zero direction would score exactly
            # 0 and tell present canaries apart by a missing noise term, not by the release.
            d = own_push
            idle = d.norm(dim=1) == 0
            d[idle] = self._absent_directions(k)[idle]
        else:
            d = self._absent_directions(k).clone()
            if bool(present.any()):
                truth_dir, _ = self._truth_direction(view, users[present])
                d[present] = truth_dir.to(d.dtype)
            if self._canary_seen is None:
                self._canary_seen = torch.zeros(users.shape[0], dtype=torch.bool)
            sign = hooks.canary_sign
            if sign is not None:
                # The model says how a positive's push on its row evolves after the first round
                # (FedRAP: it flips; under DP-SGD its sign is unknown, so it is not scored).
                d = d * sign(here & self._canary_seen, can.unit).unsqueeze(1).to(d.dtype)
            self._canary_seen |= here
        d = d / d.norm(dim=1, keepdim=True).clamp_min(1e-30)
        score = (obs * d).sum(1).double().numpy()
        self.acc.canary_score += score
        return score


def _total_items(view: Any, plan: RecordPlan) -> int:
    return int(view.model.split.n_items)


def save_accumulators(recorder: AttackRecorder, path: Path) -> int:
    """Write the accumulated statistics (for ``--run DIR`` reuse); returns bytes written."""
    acc = recorder.acc
    arrays: dict[str, Any] = {k: v for k, v in vars(acc).items() if isinstance(v, np.ndarray)}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    data = buf.getvalue()
    path.write_bytes(data)
    return len(data)


def load_accumulators(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        from securefed.errors import DataError

        raise DataError(f"cannot read recorded attack statistics {path}: {exc}") from None
