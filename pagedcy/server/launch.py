"""``python -m pagedcy serve``: build the engine and the app, run uvicorn, stop cleanly.

SIGINT or SIGTERM stops accepting requests, aborts the running ones (their streams end with
finish_reason "abort" and their pages return to the pool), lets uvicorn close the
connections, and exits 0.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
import sys

from pagedcy.server.auth import API_KEY_ENV, resolve_api_key
from pagedcy.tools._argtypes import port_number

logger = logging.getLogger("pagedcy.server")

LOOPBACK_NAMES = ("localhost", "ip6-localhost")


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The ``LLMEngine`` options of ``serve`` (``bench --serve`` has its own few)."""
    p.add_argument("--kv-cache-pages", type=int, default=None, help="KV pages in the pool")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--kv-dtype", default="float32", choices=["float32", "float16", "bfloat16", "int8"])
    add_weight_arguments(p)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--no-prefix-cache", action="store_true", help="disable prefix caching")
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"])
    p.add_argument("--swap-pages", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output (default: the model's context or the KV pool's "
                        "tokens, the smaller)")
    p.add_argument("--kv-store", default=None, metavar="URL",
                   help="Redis URL of a KV page store shared by servers of the same model "
                        "(redis://host:port/db, rediss://, unix:///path.sock)")


def add_weight_arguments(p: argparse.ArgumentParser) -> None:
    """``--dtype``, ``--quantization`` (how the weights are held, vLLM's names) and
    ``--activation-dtype`` (what block-format weights multiply)."""
    from pagedcy.models.storage import ACTIVATION_DTYPES, DTYPES, QUANTIZATIONS
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="weight storage: auto keeps the checkpoint's (16-bit stays 16-bit)")
    p.add_argument("--quantization", default=None, choices=[q for q in QUANTIZATIONS if q],
                   help="quantize the projections at load to this GGUF block format")
    p.add_argument("--activation-dtype", default="auto", choices=ACTIVATION_DTYPES,
                   help="auto: int8 activations for Q4_K/Q5_0/Q6_K/Q8_0 weights and int8 decode "
                        "queries over an int8 KV cache (as llama.cpp); "
                        "float32: float32 activations everywhere")


def engine_kwargs(args) -> dict:
    """``LLMEngine`` keyword arguments from parsed engine options."""
    return dict(kv_cache_pages=args.kv_cache_pages, page_size=args.page_size,
                kv_dtype=args.kv_dtype, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                enable_prefix_cache=not args.no_prefix_cache, num_threads=args.num_threads,
                seed=args.seed, preemption_mode=args.preemption_mode, swap_pages=args.swap_pages,
                max_model_len=args.max_model_len, dtype=args.dtype,
                quantization=args.quantization, activation_dtype=args.activation_dtype,
                kv_store=args.kv_store)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The ``serve`` subcommand's options."""
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="name clients use in 'model' (default: the --model path)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /v1 (or set ${API_KEY_ENV}, "
                        "which other users cannot read in the process list)")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="refuse new requests with 503 while this many wait (default: no limit)")
    p.add_argument("--log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug"])
    add_engine_arguments(p)
    add_replica_arguments(p)


def add_replica_arguments(p: argparse.ArgumentParser) -> None:
    """``serve --replicas N``: engine replicas on Ray Serve (:mod:`pagedcy.server.replicas`)."""
    p.add_argument("--replicas", type=int, default=None,
                   help="serve through N engine replicas on Ray Serve (needs ray[serve]; "
                        "default: one engine in this process)")
    p.add_argument("--replica-cpus", type=float, default=None,
                   help="Ray CPUs each replica reserves (default: --num-threads, or 1)")
    p.add_argument("--router", default="prefix", choices=["prefix", "round-robin", "ray-prefix"],
                   help="how requests pick a replica: the longest cached prefix of the prompt "
                        "(default), in turn, or Ray's PrefixCacheAffinityRouter (for comparison)")
    p.add_argument("--route-max-load-gap", type=int, default=8,
                   help="prefix routing gives way to the least-loaded replica when the best "
                        "match has this many more requests in flight (default 8)")
    p.add_argument("--ray-address", default=None,
                   help="Ray cluster to join (default: $RAY_ADDRESS, else a local cluster)")


def is_loopback(host: str) -> bool:
    """True if ``host`` names only loopback addresses."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def bind_warning(host: str, api_key) -> "str | None":
    """The warning printed when ``host`` is not loopback and no API key is set, else None."""
    if api_key or is_loopback(host):
        return None
    return (f"WARNING: binding {host} (not loopback) without an API key: anyone who can reach "
            f"this port can use the model. Pass --api-key or set ${API_KEY_ENV}.")


def make_server(app, *, host: str, port: int, log_level: str, on_exit):
    """A ``uvicorn.Server`` whose signal handler also calls ``on_exit()`` (abort requests)."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            on_exit()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=10, access_log=log_level == "debug")
    return _Server(config)


def _serve_replicas(args, api_key) -> int:
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        raise SystemExit(f"pagedcy serve: cannot load {args.model}: no config.json there")
    try:
        from pagedcy.server.replicas import serve_replicas
    except ImportError as exc:
        raise SystemExit(f"pagedcy serve --replicas needs ray[serve] "
                         f"(pip install 'pagedcy[replicas]'): {exc}") from None
    try:
        return serve_replicas(args, api_key)
    except ValueError as exc:
        raise SystemExit(f"pagedcy serve: {exc}") from None


def serve(args) -> int:
    """Run the server until SIGINT/SIGTERM; 0 on a clean stop."""
    from pagedcy.engine import LLMEngine
    from pagedcy.server.app import build_app
    from pagedcy.server.async_engine import AsyncEngine
    from pagedcy.server.chat_template import ChatTemplate, TemplateError

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.max_waiting is not None and args.max_waiting < 0:
        raise SystemExit("--max-waiting must be >= 0")
    api_key = resolve_api_key(args.api_key)
    warning = bind_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if args.replicas is not None:
        return _serve_replicas(args, api_key)
    try:
        engine = LLMEngine(args.model, **engine_kwargs(args))
    except (OSError, ValueError, TypeError) as exc:
        raise SystemExit(f"pagedcy serve: cannot load {args.model}: {exc}") from None
    try:
        template = ChatTemplate.from_model_dir(args.model, engine.tokenizer)
    except TemplateError as exc:
        print(f"WARNING: {exc}; /v1/chat/completions will refuse requests", file=sys.stderr)
        template = None
    async_engine = AsyncEngine(engine, max_waiting=args.max_waiting)
    names = [args.served_model_name or args.model]
    app = build_app(async_engine, model_names=names, chat_template=template, api_key=api_key)
    server = make_server(app, host=args.host, port=args.port, log_level=args.log_level,
                         on_exit=async_engine.stop_accepting)
    # uvicorn re-raises the signal it caught once it has shut down; these handlers take it,
    # so a requested stop exits 0 instead of dying of the signal.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"pagedcy: serving {names[0]} at http://{host}:{args.port}/v1"
          f"{' (API key required)' if api_key else ''}; Ctrl+C or SIGTERM stops",
          file=sys.stderr, flush=True)
    try:
        server.run()
    finally:
        async_engine.shutdown()
        engine.close()          # sends the KV store's queued pages
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else 1
