"""Ray Serve request routers for the engine deployment (Ray 2.60's ``RequestRouter`` API).

:class:`PrefixAwareRouter` sends a request to the replica that holds the longest leading run
of its prompt's pages (:mod:`pagedcy.server.routing` decides; this class feeds it). Each
replica's ``record_routing_stats`` reports the keys of its prefix-cache pages; Serve's
controller polls it every ``request_routing_stats_period_s`` and hands the result to this
router as ``RunningReplica.routing_stats``. Prompts routed since the last report count as held
by their replica, so a burst of requests sharing a new prefix follows the first of them.
Loads are the requests in flight per replica (Serve's queue-length cache, else this router's
own count). :class:`RoundRobinRouter` is the baseline the benchmark compares with.
"""
from __future__ import annotations

import random
import time
from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from pagedcy.server.routing import PrefixIndex, rank, unpack_keys


def request_keys(pending_request: Optional[PendingRequest]) -> list:
    """The page keys of a pending ``ReplicaRequest`` (empty for anything else)."""
    if pending_request is None or not pending_request.args:
        return []
    return list(getattr(pending_request.args[0], "page_keys", None) or [])


class PrefixAwareRouter(RequestRouter):
    """Longest held prefix first, unless that replica is ``max_load_gap`` requests busier
    than the least loaded one (then the least loaded)."""

    def initialize_state(self, max_load_gap: int = 8,  # type: ignore[override]
                         seed: Optional[int] = None):
        """``request_router_kwargs``: ``max_load_gap`` (requests), ``seed`` (of tie draws)."""
        self._index = PrefixIndex()
        self._max_load_gap = int(max_load_gap)
        self._rng = random.Random(seed)

    def _ingest(self, replica: RunningReplica) -> None:
        stats = replica.routing_stats or {}
        at = stats.get("at")
        if at is None or "pages" not in stats or self._index.last_report(replica.replica_id) == at:
            return
        self._index.report(replica.replica_id, unpack_keys(stats["pages"]), float(at))

    def _load(self, replica: RunningReplica) -> int:
        cached = self._replica_queue_len_cache.get(replica.replica_id)
        return self._index.inflight(replica.replica_id) if cached is None else int(cached)

    def update_replicas(self, replicas: List[RunningReplica]):
        """Serve's update (new replicas or new routing stats): refresh the index."""
        super().update_replicas(replicas)
        self._index.retain(r.replica_id for r in replicas)
        for r in replicas:
            self._ingest(r)

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None
                              ) -> List[List[RunningReplica]]:
        """One rank per replica, best first (Serve tries them in order)."""
        keys = request_keys(pending_request)
        by_id = {}
        cands = []
        for r in candidate_replicas:
            self._ingest(r)
            by_id[r.replica_id] = r
            cands.append(self._index.candidate(r.replica_id, keys, self._load(r)))
        return [[by_id[rid]] for rid in rank(cands, max_load_gap=self._max_load_gap,
                                              rng=self._rng)]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        """Count the request's prompt as held by ``replica_id`` from now on."""
        self._index.routed(replica_id, pending_request.metadata.internal_request_id,
                           request_keys(pending_request))

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        """The request ended: its pages count until the replica's next report."""
        self._index.completed(replica_id, internal_request_id, time.time())

    def on_replica_actor_died(self, replica_id):
        """Forget a dead replica's pages."""
        super().on_replica_actor_died(replica_id)
        self._index.forget(replica_id)


class RoundRobinRouter(RequestRouter):
    """Each request to the next replica in turn (replica ids in order), prompt unseen."""

    def initialize_state(self, **_ignored):
        """No state but the turn."""
        self._turn = 0

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None
                              ) -> List[List[RunningReplica]]:
        """The next replica first, the others after it."""
        if not candidate_replicas:
            return []
        order = sorted(candidate_replicas, key=lambda r: r.replica_id.to_full_id_str())
        i = self._turn % len(order)
        self._turn += 1
        return [[r] for r in order[i:] + order[:i]]
