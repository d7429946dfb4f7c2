"""The one entry point of Colossal's benchmarks.

    python benchmarks/run.py NAME [--quick]

runs ``benchmarks/bench_NAME.py``'s ``run(quick=..., out_dir=...)``, prints its table and writes
``benchmarks/results/NAME.json`` and ``NAME.md``. ``--quick`` is a smaller run that finishes
within a minute on a 2-core machine; it writes ``NAME_quick.json`` and ``NAME_quick.md`` (and
its plots as ``*_quick.png``), so it never overwrites a full run's results.
``python benchmarks/run.py --list`` lists the benchmarks.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
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
    from _report import write

    module = importlib.import_module(f"bench_{args.name}")
    if args.quick:  # plots go to a scratch folder first: the full run's keep their names
        with tempfile.TemporaryDirectory(prefix=f"bench-{args.name}-") as scratch:
            report = module.run(quick=True, out_dir=Path(scratch))
            js, md = write(report, RESULTS, True, figures_dir=Path(scratch))
    else:
        report = module.run(quick=False, out_dir=RESULTS)
        js, md = write(report, RESULTS, False)
    print(md.read_text(), end="")
    print(f"wrote {js.relative_to(HERE.parent)} and {md.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
