"""Node loss as a cause of its own: the built-in guard ``peer_lost``.

A worker failure that follows the loss of another node of the job (its agent stopped sending
the rendezvous keep-alive: the machine is gone) is neither this node's fault nor the user's
program's. A spec's failure policy can give it a rule and a budget of its own, so that a lost
machine never spends ``--max-restarts`` (``resilient``: rule ``peer_lost``, budget
``node_replacements``, restarting at once so that a waiting spare joins the next round).

The driver decides, through an optional method ``lost_peers()`` (the nodes of the current
round it knows to be lost; empty when none is): the torch driver reads torch's own c10d
rendezvous keep-alive (``fsm_agent.torch._peers``), the kit's driver its script. A driver
without it never reports a loss, and the guard is then always false.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ._driver import PeerDriver

if TYPE_CHECKING:
    from ._context import Context, Guard

__all__ = ["GUARDS", "PEER_LOST_GUARD", "describe_lost", "lost_peers"]

log = logging.getLogger("fsm_agent")

_LOST_PEERS = PeerDriver.lost_peers.__name__

#: The built-in guard's name.
PEER_LOST_GUARD = "peer_lost"


def lost_peers(ctx: Context) -> tuple[str, ...]:
    """The nodes of the current round the driver knows to be lost (none without a driver
    method ``lost_peers``)."""
    # every healthy tick of a spec that asks peer_lost comes here: a getattr, not capability()
    ask: Callable[[], Iterable[object]] | None = getattr(ctx.driver, _LOST_PEERS, None)
    if ask is None:
        return ()
    return tuple(str(node) for node in ask())


def describe_lost(nodes: tuple[str, ...]) -> str:
    """The words for lost nodes, in the guard's log line and the exit barrier's."""
    return f"lost node(s) of the job: {', '.join(nodes)} (their agent's keep-alive stopped)"


def _peer_lost(ctx: Context) -> bool:
    lost = lost_peers(ctx)
    if lost:
        log.warning("[%s] %s", ctx.role, describe_lost(lost))
    return bool(lost)


GUARDS: dict[str, Guard] = {PEER_LOST_GUARD: _peer_lost}
