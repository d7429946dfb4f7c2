"""The one entry point of Colossal's benchmarks.

    python benchmarks/run.py NAME [--quick]

runs ``benchmarks/bench_NAME.py``'s ``run(quick=..., out_dir=...)``, prints its table and writes
``benchmarks/results/NAME.json`` and ``NAME.md``. ``--quick`` is a smaller run that finishes
within a minute on a 2-core machine. ``python benchmarks/run.py --list`` lists the benchmarks.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def available() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("name", nargs="?", help="benchmark to run")
    parser.add_argument("--quick", action="store_true", help="small sizes; under a minute")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    names = available()
    if args.list or not args.name:
        print("benchmarks: " + ", ".join(names))
        return 0 if args.list else 2
    if args.name not in names:
        print(
            f"error: unknown benchmark {args.name!r}; choose one of: {', '.join(names)}",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(HERE))
    from _report import environment, to_markdown, write

    module = importlib.import_module(f"bench_{args.name}")
    report = module.run(quick=args.quick, out_dir=RESULTS)
    js, md = write(report, RESULTS, args.quick)
    print(to_markdown(report, environment(), args.quick))
    print(f"wrote {js.relative_to(HERE.parent)} and {md.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
