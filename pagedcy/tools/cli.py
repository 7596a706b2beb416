"""Command line: ``python -m pagedcy {info,demo,bench}``."""
import argparse
import sys


def _info(args):
    from pagedcy import show_config
    show_config()
    return 0


def _demo(args):
    from pagedcy.tools.demo import main
    return main(args)


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
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        # bench has its own parser; hand it everything (argparse.REMAINDER drops leading flags).
        from pagedcy.tools.bench import main as bench_main
        bench_main(argv[1:])
        return 0
    args = parser.parse_args(argv)
    return {"info": _info, "demo": _demo}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
