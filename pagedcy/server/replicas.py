"""``serve --replicas N``: the OpenAI server over N engine replicas on Ray Serve.

Two deployments: ``PagedcyEngine`` (N replicas, each one :class:`~pagedcy.engine.LLMEngine` on
its own thread in its own actor, ``num_cpus`` = ``--replica-cpus``, the kernels on
``--num-threads`` threads) and ``PagedcyFrontend`` (the HTTP ingress: the same routes, API key
and streaming as the single-process server, built by :func:`pagedcy.server.app.build_app`
over a :class:`~pagedcy.server.remote_engine.RemoteEngine`). The front end tokenizes; the
engine deployment's router (:mod:`pagedcy.server.router`, ``--router prefix`` by default)
sends each request to the replica holding the longest prefix of its prompt.

``python -m pagedcy serve --model DIR --replicas 2`` starts a local Ray cluster (or joins
``--ray-address`` / ``$RAY_ADDRESS``), or deploy with Serve's own CLI::

    serve run pagedcy.server.replicas:build_app model=DIR replicas=2 num_threads=1

(every ``serve`` flag as ``name=value``; flags without a value as ``no_prefix_cache=true``).
A client that disconnects cancels its call, which aborts the request on its replica. A replica
that dies is restarted by Serve; requests it was serving fail with 503 (``replica_died``).
SIGINT/SIGTERM stops taking requests, lets running ones finish (up to 10 s) and exits 0.
``GET /debug/replicas`` (open, like ``/metrics``) lists each replica's requests and stats.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from contextlib import aclosing

from ray import serve

from pagedcy.server.async_engine import Aborted
from pagedcy.server.errors import APIError
from pagedcy.server.remote_engine import DeltaEncoder, OutputDelta, RemoteEngine
from pagedcy.server.routing import pack_keys

logger = logging.getLogger("pagedcy.server")

ENGINE_DEPLOYMENT = "PagedcyEngine"
FRONTEND_DEPLOYMENT = "PagedcyFrontend"
APP_NAME = "pagedcy"
#: Seconds between a replica's reports of its prefix-cache pages to the router.
ROUTING_STATS_PERIOD_S = 0.5
#: Seconds Serve lets running requests finish when a replica or the app stops.
GRACEFUL_SHUTDOWN_S = 10.0


class EngineReplica:
    """One engine replica: an :class:`AsyncEngine` over an ``LLMEngine`` in this actor.

    ``engine_options``: ``LLMEngine`` keyword arguments; ``max_waiting`` as in ``serve``.
    """

    async def __init__(self, model: str, engine_options: dict, max_waiting=None):  # type: ignore[misc]
        from pagedcy.engine import LLMEngine
        from pagedcy.server.async_engine import AsyncEngine
        self._engine = LLMEngine(model, **engine_options)
        self._async = AsyncEngine(self._engine, max_waiting=max_waiting)
        self._async.start()            # outputs go to this replica's event loop
        try:
            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:              # constructed outside Serve (a test)
            self.replica_id = f"local-{os.getpid()}"

    async def info(self) -> dict:
        """What the front end needs of the engine."""
        e = self._engine
        return {"model_dir": str(e.model_dir), "max_model_len": int(e.max_model_len),
                "max_num_seqs": int(e.max_num_seqs), "page_size": int(e.manager.block_size()),
                "replica": self.replica_id}

    async def generate(self, request):
        """Stream the :class:`OutputDelta` s of a ``ReplicaRequest``; cancelling the call
        aborts the request (closing the engine stream does)."""
        enc = DeltaEncoder(self.replica_id)
        stream = self._async.generate(request.request_id,
                                      {"prompt_token_ids": request.prompt_token_ids},
                                      request.params)
        try:
            async with aclosing(stream):
                async for out in stream:
                    if isinstance(out, Aborted):             # the replica is stopping
                        yield OutputDelta(self.replica_id, finished=True, aborted=True,
                                          stats=self._async.stats)
                        return
                    yield enc.encode(out, self._async.stats if out.finished else None)
        except APIError as err:       # refused: tell the front end, which answers the client
            yield OutputDelta(self.replica_id, finished=True,
                              error=(err.status, err.message, err.code, err.param))

    def record_routing_stats(self) -> dict:
        """Serve's routing-stats hook: the keys of the prefix-cache pages, and when."""
        at = time.time()
        return {"pages": pack_keys(self._engine.manager.cached_page_hashes().values()), "at": at}

    def check_health(self) -> None:
        """Serve's health check: fails once the engine thread has stopped or failed."""
        if not self._async.is_alive():
            raise RuntimeError(f"the engine thread is not running: {self._async.error!r}")

    def __del__(self):
        async_engine = getattr(self, "_async", None)
        if async_engine is not None:
            async_engine.shutdown(timeout=5.0)


@serve.ingress()
class Frontend:
    """The HTTP ingress: pagedcy's routes over a :class:`RemoteEngine` to ``engine``."""

    async def __init__(self, engine, options: dict):  # type: ignore[misc]
        self._engine_handle = engine
        self._options = options
        self._remote = None

    async def drain(self, timeout: float = GRACEFUL_SHUTDOWN_S) -> int:
        """Refuse new requests (503, /health too) and wait up to ``timeout`` s for the
        running ones; returns how many still run."""
        return await self._remote.drain(timeout) if self._remote is not None else 0

    async def __serve_build_asgi_app__(self):
        from pagedcy.engine.tokenizer import load_tokenizer
        from pagedcy.server.app import build_app
        from pagedcy.server.chat_template import ChatTemplate, TemplateError
        o = self._options
        info = await self._engine_handle.info.remote()
        tokenizer = load_tokenizer(o["model"])
        try:
            template = ChatTemplate.from_model_dir(o["model"], tokenizer)
        except TemplateError as exc:
            logger.warning("%s; /v1/chat/completions will refuse requests", exc)
            template = None
        remote = self._remote = RemoteEngine(self._engine_handle, info, tokenizer)
        app = build_app(remote, model_names=[o["served_model_name"] or o["model"]],
                        chat_template=template, api_key=o["api_key"])

        @app.get("/debug/replicas")
        async def replicas():
            return {"replicas": remote.replicas()}
        return app


def replica_cpus(args) -> float:
    """``--replica-cpus``, by default ``--num-threads`` (1 without it)."""
    cpus = args.replica_cpus if args.replica_cpus is not None else (args.num_threads or 1)
    if cpus <= 0:
        raise ValueError(f"--replica-cpus must be > 0, got {cpus}")
    return float(cpus)


def application(args, api_key=None):
    """The Serve application of parsed ``serve`` arguments (``--replicas`` included)."""
    from ray.serve.config import RequestRouterConfig

    from pagedcy.server.launch import engine_kwargs
    from pagedcy.server.router import PrefixAwareRouter, RoundRobinRouter
    if args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    if args.route_max_load_gap < 0:
        raise ValueError(f"--route-max-load-gap must be >= 0, got {args.route_max_load_gap}")
    gap = args.route_max_load_gap
    router, kwargs = {
        "prefix": (PrefixAwareRouter, {"max_load_gap": gap}),
        "round-robin": (RoundRobinRouter, {}),
        # Ray's text-prefix router (ray.llm), for comparison; on ReplicaRequest.prompt
        "ray-prefix": ("ray.llm._internal.serve.routing_policies.prefix_aware."
                       "prefix_aware_router.PrefixCacheAffinityRouter",
                       {"imbalanced_threshold": gap}),
    }[args.router]
    engine = serve.deployment(EngineReplica).options(
        name=ENGINE_DEPLOYMENT, num_replicas=args.replicas,
        ray_actor_options={"num_cpus": replica_cpus(args)},
        # the engine batches up to max_num_seqs and queues the rest itself
        max_ongoing_requests=max(2 * args.max_num_seqs, 64),
        health_check_period_s=2.0, health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
        request_router_config=RequestRouterConfig(
            request_router_class=router, request_router_kwargs=kwargs,
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
            request_routing_stats_timeout_s=10.0),
    ).bind(args.model, engine_kwargs(args), args.max_waiting)
    options = {"model": args.model, "served_model_name": args.served_model_name,
               "api_key": api_key}
    return serve.deployment(Frontend).options(
        name=FRONTEND_DEPLOYMENT, num_replicas=1, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=100_000, graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
    ).bind(engine, options)


def build_app(builder_args: dict):
    """Serve's app builder: ``serve run pagedcy.server.replicas:build_app model=DIR
    replicas=2 ...`` (each ``serve`` flag as ``name=value``; API key from ``api_key=`` or
    ``$PAGEDCY_API_KEY``)."""
    import argparse

    from pagedcy.server.auth import resolve_api_key
    from pagedcy.server.launch import add_serve_arguments
    argv = []
    for name, value in builder_args.items():
        flag = "--" + str(name).replace("_", "-")
        if str(value).lower() in ("true", ""):
            argv.append(flag)
        elif str(value).lower() != "false":
            argv += [flag, str(value)]
    class _Parser(argparse.ArgumentParser):
        def error(self, message):            # serve run shows the exception
            raise ValueError(f"pagedcy.server.replicas:build_app: {message}")
    parser = _Parser(prog="pagedcy.server.replicas:build_app")
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    if args.replicas is None:
        args.replicas = 1
    return application(args, api_key=resolve_api_key(args.api_key))


def _worker_path() -> None:
    """Put the directory this pagedcy imports from on ``$PYTHONPATH``, which the workers of
    a local cluster inherit, so they run the same pagedcy."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in (os.path.abspath(p) for p in paths):
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def init_ray(address=None, num_cpus=None, namespace="pagedcy", attempts=3):
    """Join ``address`` (or ``$RAY_ADDRESS``), else start a local cluster of ``num_cpus``.

    Returns ``ray.init``'s context. Ray gives a new raylet a fixed 30 s to register with its
    GCS; a loaded 2-core host has missed that while 3 s is usual, so a local start that times
    out is retried on a fresh session, up to ``attempts`` starts in all.
    """
    import ray
    _worker_path()
    if address or os.environ.get("RAY_ADDRESS"):
        return ray.init(address=address or os.environ["RAY_ADDRESS"], namespace=namespace,
                        log_to_driver=False)
    attempt = 1
    while True:
        try:
            return ray.init(num_cpus=num_cpus, include_dashboard=False, namespace=namespace,
                            log_to_driver=False)
        except Exception as e:           # ray raises a bare Exception for this timeout
            ray.shutdown()
            if attempt >= attempts or "timed out during startup" not in str(e):
                raise
            attempt += 1
            time.sleep(2.0)


def serve_replicas(args, api_key=None) -> int:
    """``serve --replicas N``: deploy, wait for SIGINT/SIGTERM, drain, exit 0."""
    import ray
    app = application(args, api_key=api_key)
    init_ray(args.ray_address,
             max(os.cpu_count() or 1, int(args.replicas * replica_cpus(args) + 0.999)))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"pagedcy: serving {args.served_model_name or args.model} on {args.replicas} "
              f"replicas ({args.router} routing) at http://{host}:{args.port}/v1"
              f"{' (API key required)' if api_key else ''}; Ctrl+C or SIGTERM stops",
              file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            pass
        print(f"pagedcy: stopping; running requests have {GRACEFUL_SHUTDOWN_S:g} s to finish",
              file=sys.stderr, flush=True)
        front = serve.get_deployment_handle(FRONTEND_DEPLOYMENT, app_name=APP_NAME)
        left = front.drain.remote(GRACEFUL_SHUTDOWN_S).result(
            timeout_s=GRACEFUL_SHUTDOWN_S + 30)
        if left:
            print(f"pagedcy: {left} requests still running are cut off", file=sys.stderr,
                  flush=True)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return 0
