"""``python -m bench <suite>``: the benchmarks, one suite per subject.

Every suite writes ``OUT/<suite>.json`` (``bench/report.py``) and runs as a list of named steps;
``--state DIR`` keeps the finished ones so that the same command run again goes on where it
stopped, and ``--part-s N`` ends a run before a step that would not fit in N seconds
(``bench/suite.py``). On a GPU machine, ``bash bench/start_mps.sh`` starts the MPS daemon first.
A torch installed without bytecode is byte-compiled before the first step, as ``pip install``
does (``bench/bytecode.py``; ``--as-installed`` measures it as it is).
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUITES = (
    "limits",
    "pipeline",
    "end-to-end",
    "tuning",
    "learning",
    "peers",
    "gmi",
    "faults",
    "sharing",
    "backends",
    "transport",
    "goodput",
)


def _module(suite: str):
    return importlib.import_module(f"bench.suites.{suite.replace('-', '_')}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.split("\n", 1)[0],
        epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="suite", metavar="SUITE", title="suites")
    sub.required = True
    for name in SUITES:
        mod = _module(name)
        sp = sub.add_parser(
            name,
            help=mod.HELP,
            description=mod.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_args(sp)
        run = sp.add_argument_group("how the suite runs")
        run.add_argument("--out", default="out", metavar="DIR", help="result documents go here")
        run.add_argument(
            "--state",
            default=None,
            metavar="DIR",
            help="keep finished steps here; the same command again skips them",
        )
        run.add_argument(
            "--as-installed",
            action="store_true",
            help="measure a torch installed without bytecode as it is (by default the suite "
            "byte-compiles its site-packages first, as pip install does: bench/bytecode.py)",
        )
        run.add_argument(
            "--part-s",
            type=float,
            default=0.0,
            metavar="N",
            help="stop before a step that would not fit in N seconds (needs --state)",
        )
        sp.set_defaults(_check=getattr(mod, "check", None), _plan=mod.plan, _parser=sp)
    from bench import figures

    sp = sub.add_parser(
        "figures",
        help=figures.HELP,
        description=figures.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    figures.add_args(sp)
    sp.set_defaults(_parser=sp)
    return ap


def main(argv: list[str] | None = None) -> int:
    from bench.suite import run_suite

    argv = sys.argv[1:] if argv is None else argv
    ap = parser()
    if argv and not argv[0].startswith("-") and argv[0] not in (*SUITES, "figures"):
        ap.error(
            f"unknown suite {argv[0]!r}; the suites are: {', '.join(SUITES)} "
            "(and figures, which draws the page's plots)"
        )
    a, extra = ap.parse_known_args(argv)
    if a.suite == "figures":
        if extra:
            a._parser.error(f"unrecognized arguments: {' '.join(extra)}")
        from bench import figures

        try:
            figures.run(a.results, a.only)
        except ValueError as e:
            a._parser.error(str(e))
        return 0
    if extra:
        flags = sorted(f for f in a._parser._option_string_actions if f.startswith("--"))
        a._parser.error(
            f"unrecognized arguments: {' '.join(extra)}; the flags of {a.suite} are "
            f"{', '.join(flags)} (python -m bench {a.suite} --help says what each does)"
        )
    if a.part_s < 0:
        a._parser.error(f"--part-s {a.part_s:g}: must be >= 0 (0: no limit)")
    if a._check is not None:
        a._check(a._parser, a)
    from bench.bytecode import ensure_bytecode

    ensure_bytecode(compile_missing=not a.as_installed)
    steps, finish = a._plan(a)
    return run_suite(a.suite, steps, a, argv[1:], finish)


if __name__ == "__main__":
    sys.exit(main())
