"""Command line: ``python -m pagedcy {info,demo,bench,serve}``."""
import argparse
import sys


def _info(args):
    from pagedcy import show_config
    show_config()
    return 0


def _demo(args):
    from pagedcy.tools.demo import main
    return main(args)


def _serve(args):
    from pagedcy.server.launch import serve
    return serve(args)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m pagedcy", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="print the build configuration (show_config)")
    demo = sub.add_parser("demo", help="run a short paged-cache workload and print a summary")
    demo.add_argument("--requests", type=int, default=None,
                      help="number of requests (default 300; 60 with --quick)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--quick", action="store_true", help="a smaller run (for CI)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench = sub.add_parser("bench", help="run the headline attention benchmarks", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    from pagedcy.server.launch import add_serve_arguments
    add_serve_arguments(sub.add_parser("serve", help="run the OpenAI-compatible server"))
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"] and "--serve" in argv:
        from pagedcy.tools.bench_serve import main as bench_serve_main
        return bench_serve_main([a for a in argv[1:] if a != "--serve"])
    if argv[:1] == ["bench"]:
        # bench has its own parser; hand it everything (argparse.REMAINDER drops leading flags).
        from pagedcy.tools.bench import main as bench_main
        bench_main(argv[1:])
        return 0
    args = parser.parse_args(argv)
    return {"info": _info, "demo": _demo, "serve": _serve}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
