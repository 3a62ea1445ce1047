"""Who is who in a tp x pp group, which layers each pipeline stage holds, and the multi-node env.

Pure functions (no torch). Multi-node runs are LeaderWorkerSet groups, one pod per pipeline stage group
of nodes; LeaderWorkerSet sets, in every pod of a group:
  LWS_LEADER_ADDRESS  the leader pod's DNS name: the rendezvous host (torch.distributed's TCP store)
  LWS_GROUP_SIZE      pods in the group (nodes)
  LWS_WORKER_INDEX    this pod's index in the group (0: the leader, which serves HTTP)
KVPILOT_DIST_PORT (default 29500) is the rendezvous port on the leader. Each node runs
tp * pp / LWS_GROUP_SIZE consecutive ranks, one per local GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_DIST_PORT = 29500
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
DIST_PORT_ENV = "KVPILOT_DIST_PORT"


class TopologyError(ValueError):
    """The parallel layout or the multi-node environment is inconsistent; the message names the numbers."""


@dataclass(frozen=True)
class Rank:
    """One process of a tp x pp group."""

    rank: int
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    def stage_ranks(self, pp_rank: int) -> list[int]:
        """Global ranks of pipeline stage pp_rank."""
        return list(range(pp_rank * self.tp, (pp_rank + 1) * self.tp))


def stage_layers(num_layers: int, pp: int, pp_rank: int) -> range:
    """The layers of stage pp_rank: the first num_layers % pp stages hold one more, so the busiest stage
    holds ceil(num_layers / pp) layers (what the planner sizes for)."""
    base, extra = divmod(num_layers, pp)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (1 if pp_rank < extra else 0))


@dataclass(frozen=True)
class NodeLaunch:
    """What this node runs: the ranks [first_rank, first_rank + local_ranks) and where to rendezvous."""

    master_addr: str
    master_port: int
    first_rank: int
    local_ranks: int
    num_nodes: int

    @property
    def is_leader(self) -> bool:
        return self.first_rank == 0


def node_launch(env: Mapping[str, str], world_size: int, *, local_addr: str = "127.0.0.1") -> NodeLaunch:
    """This node's share of the group: from the LWS_* variables when LeaderWorkerSet set them, else one
    node holding every rank (rendezvous on local_addr)."""
    port_text = env.get(DIST_PORT_ENV, str(DEFAULT_DIST_PORT))
    if not port_text.isdigit():
        raise TopologyError(f"{DIST_PORT_ENV}={port_text!r} is not a port number")
    if LWS_GROUP_SIZE not in env:
        return NodeLaunch(local_addr, int(port_text), 0, world_size, 1)
    try:
        nodes, index = int(env[LWS_GROUP_SIZE]), int(env.get(LWS_WORKER_INDEX, "0"))
    except ValueError as exc:
        raise TopologyError(f"{LWS_GROUP_SIZE}/{LWS_WORKER_INDEX} must be integers: {exc}") from exc
    leader = env.get(LWS_LEADER_ADDRESS, "")
    if nodes < 1 or not 0 <= index < nodes:
        raise TopologyError(f"{LWS_WORKER_INDEX}={index} is not within {LWS_GROUP_SIZE}={nodes}")
    if world_size % nodes:
        raise TopologyError(
            f"tensor x pipeline parallel = {world_size} ranks cannot be spread evenly over "
            f"{LWS_GROUP_SIZE}={nodes} nodes"
        )
    if nodes > 1 and not leader:
        raise TopologyError(f"{LWS_LEADER_ADDRESS} is not set in a group of {nodes} nodes")
    per_node = world_size // nodes
    return NodeLaunch(leader or local_addr, int(port_text), index * per_node, per_node, nodes)
