"""Command line: ``python -m pagedcy {info,demo,generate,bench,serve}``."""
import argparse
import sys

from pagedcy.tools._argtypes import positive_int


def _info(args):
    from pagedcy import show_config
    show_config()
    return 0


def _demo(args):
    from pagedcy.tools.demo import main
    return main(args)


def _generate(args):
    from pagedcy.tools.generate import main
    return main(args)


def _serve(args):
    from pagedcy.server.launch import serve
    return serve(args)


def main(argv=None):
    """Run ``python -m pagedcy`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m pagedcy", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="print the build configuration (show_config)")
    demo = sub.add_parser("demo", help="serve a batch of requests with a small random Llama "
                                       "(continuous batching) and print a summary")
    demo.add_argument("--requests", type=positive_int, default=None,
                      help="number of requests (default 200; 48 with --quick)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--threads", type=positive_int, default=None,
                      help="threads of the model's kernels (default: PAGEDCY_NUM_THREADS or "
                           "the OpenMP default)")
    demo.add_argument("--quick", action="store_true", help="a smaller model and run (for CI)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    gen = sub.add_parser("generate", help="complete one prompt with a checkpoint, streaming "
                                          "the text to stdout")
    gen.add_argument("--model", required=True, help="a Hugging Face checkpoint directory")
    gen.add_argument("--prompt", required=True, help="the prompt text")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=None,
                     help="a stop string (repeat for several)")
    gen.add_argument("--threads", type=positive_int, default=None)
    from pagedcy.server.launch import add_weight_arguments
    add_weight_arguments(gen)
    gen.add_argument("--verbose", action="store_true",
                     help="print the token count and finish reason to stderr")
    bench = sub.add_parser("bench", help="run the headline attention benchmarks", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    from pagedcy.server.launch import add_serve_arguments
    add_serve_arguments(sub.add_parser("serve", help="run the OpenAI-compatible server"))
    as_command = argv is None       # the process is `python -m pagedcy`, not a caller's
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _dispatch(parser, argv, as_command)
    except (ValueError, TypeError, OSError, MemoryError) as e:
        # a user's mistake (options, a checkpoint, a file): one line, not a traceback;
        # anything else is a bug and keeps its traceback
        print(f"python -m pagedcy {argv[0] if argv else ''}: error: {e}", file=sys.stderr)
        return 2


def _dispatch(parser, argv, as_command=False):
    if argv[:1] == ["bench"] and "--serve" in argv:
        from pagedcy.tools.bench_serve import main as bench_serve_main
        return bench_serve_main([a for a in argv[1:] if a != "--serve"])
    if argv[:1] == ["bench"]:
        # bench has its own parser; hand it everything (argparse.REMAINDER drops leading flags).
        if "--engine" in argv:
            from pagedcy.tools.bench_engine import main as engine_main
            engine_main(argv[1:], as_command=as_command)
        else:
            from pagedcy.tools.bench import main as bench_main
            bench_main(argv[1:])
        return 0
    args = parser.parse_args(argv)
    return {"info": _info, "demo": _demo, "generate": _generate, "serve": _serve}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
