"""A transport that calls the node handlers directly (no Flower, no network).

It runs exactly the message code of a deployment (every payload goes through
:func:`~securefed.flower.messages.handle_node_message`, every session is frozen and thawed
between stages) in one process, so the protocol logic is testable in seconds. ``drop`` makes a
node silent from a given stage of a given round on, like a SuperNode killed at that moment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from securefed.flower.messages import NodeMemory, Payload, handle_node_message

DropFn = Callable[[str, int, int], bool]


class LocalTransport:
    """``num_partitions`` in-process nodes with ids ``100 + partition``.

    Args:
        num_partitions: How many nodes (one partition each).
        state_dir: Root of the nodes' state directories (one sub-directory per node).
        drop: ``drop(stage, node, round)`` -> True makes the node silent from then on.
        long_lived: Each node keeps its round session and model in a :class:`NodeMemory`
            (as a long-lived ClientApp process does) instead of freezing the session into
            its store between messages.
        node_extra: Node config entries every node gets (e.g. ``enrollment``).
    """

    def __init__(
        self,
        num_partitions: int,
        *,
        state_dir: str | Path,
        drop: DropFn | None = None,
        long_lived: bool = False,
        node_extra: dict[str, Any] | None = None,
    ) -> None:
        self.node_configs: dict[int, dict[str, Any]] = {}
        for p in range(num_partitions):
            cfg: dict[str, Any] = {"partition-id": p, "num-partitions": num_partitions}
            cfg["state-dir"] = str(Path(state_dir) / f"node-{p}")
            cfg.update(node_extra or {})
            self.node_configs[100 + p] = cfg
        self.states: dict[int, dict[str, bytes]] = {n: {} for n in self.node_configs}
        self.memories: dict[int, NodeMemory] | None = (
            {n: NodeMemory() for n in self.node_configs} if long_lived else None
        )
        self.drop = drop
        self.dead: set[int] = set()
        self.seen: list[tuple[str, int, Payload]] = []  # (stage, node, reply): the server's view

    def node_ids(self) -> list[int]:
        return sorted(set(self.node_configs) - self.dead)

    def exchange(
        self, stage: str, messages: Mapping[int, Payload], *, timeout: float
    ) -> dict[int, Payload]:
        replies: dict[int, Payload] = {}
        for node, payload in messages.items():
            rnd = int(payload.config.get("round", -1))
            if node in self.dead or (self.drop is not None and self.drop(stage, node, rnd)):
                self.dead.add(node)
                continue
            reply = handle_node_message(
                stage,
                payload,
                node_config=self.node_configs[node],
                state=self.states[node],
                memory=None if self.memories is None else self.memories[node],
            )
            self.seen.append((stage, node, reply))
            replies[node] = reply
        return replies
