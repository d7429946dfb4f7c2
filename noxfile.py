"""The integration matrix. Packages are listed once, in dependency order.

nox -s ci                                   # what CI runs: lint + every test, one environment
nox -s "tests(package='colossal-chunk')"    # one package installed alone, its own tests
nox -s integration                          # integration_tests/ against the meta-package
nox -s build                                # every wheel, installed alone in a fresh venv
nox -s demo                                 # the main job: `colossal train` on the default corpus
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
PACKAGES = (
    "colossal-contracts",
    "colossal-testing",
    "colossal-memtrace",
    "colossal-chunk",
    "colossal-parallel",
    "colossal-zero",
    "colossal-models",
    "colossal-stack",
)

nox.options.sessions = ["ci"]
nox.options.reuse_existing_virtualenvs = True


def _requirement_names(package: str, *, extras: tuple[str, ...] = ()) -> list[str]:
    meta = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
    reqs = list(meta.get("dependencies", []))
    for extra in extras:
        reqs += meta.get("optional-dependencies", {}).get(extra, [])
    names = []
    for req in reqs:
        name = req.split(";")[0].split("[")[0]
        for stop in "<>=!~ ":
            name = name.split(stop)[0]
        names.append(name.strip())
    return names


def local_closure(package: str, *, extras: tuple[str, ...] = ()) -> list[str]:
    """The workspace packages ``package`` needs (itself included), dependencies first."""
    seen: list[str] = []

    def visit(name: str, ex: tuple[str, ...]) -> None:
        for dep in _requirement_names(name, extras=ex):
            if dep in PACKAGES and dep not in seen:
                visit(dep, ())
        if name not in seen:
            seen.append(name)

    visit(package, extras)
    return seen


def _install_local(
    session: nox.Session,
    package: str,
    *,
    editable: bool = False,
    all_tests: bool = False,
    test: bool = True,
) -> None:
    """Install ``package[test]`` (``package`` alone: ``test=False``) and exactly the workspace
    packages it declares, from local paths.

    ``all_tests`` installs every one of them with its own ``test`` extra (to run all their tests).
    """
    paths = []
    for name in local_closure(package, extras=("test",) if test else ()):
        path = f"packages/{name}" + ("[test]" if test and (name == package or all_tests) else "")
        paths += ["-e", path] if editable else [path]
    session.install(*CONSTRAINTS, *paths)


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One package installed alone (with only what it declares) passes its own tests."""
    _install_local(session, package)
    session.run("pytest", "-q", f"packages/{package}/tests", *session.posargs)


@nox.session
def integration(session: nox.Session) -> None:
    """Cross-package behaviour, against the meta-package."""
    _install_local(session, "colossal-stack", all_tests=True)
    session.run("pytest", "-q", "integration_tests", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and the package arrows of DESIGN.md (import-linter contracts in .importlinter)."""
    session.install("ruff>=0.6", "import-linter>=2.0")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    _install_local(session, "colossal-stack")  # lint-imports reads the installed packages
    session.run("lint-imports", "--no-cache")


@nox.session
def build(session: nox.Session) -> None:
    """Build every wheel, then install each alone (with only the wheels it declares) and import it."""
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)  # no stale wheel of the same version
    session.install("hatch>=1.12")
    for package in PACKAGES:
        with session.chdir(ROOT / "packages" / package):
            session.run("hatch", "build", "-t", "wheel", str(dist))
    tmp = Path(session.create_tmp())
    for package in PACKAGES:
        venv = tmp / f"only-{package}"
        session.run("python", "-m", "venv", "--clear", str(venv))
        py = str(venv / "bin" / "python")
        session.run(
            py,
            "-m",
            "pip",
            "install",
            "-q",
            *CONSTRAINTS,
            "--find-links",
            str(dist),
            package,
            external=True,
        )
        module = "colossal" if package == "colossal-stack" else package.replace("-", "_")
        session.run(
            py,
            "-c",
            f"import {module}; print({module}.__name__, {module}.__version__, "
            f"len({module}.__all__), 'public names')",
            external=True,
        )


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: train the tiny GPT on the embedded corpus (Python's own standard library)."""
    _install_local(session, "colossal-stack", test=False)  # what a user installs: no test tools
    session.run("colossal", "train", *(session.posargs or ["--out", "runs/demo"]))


@nox.session
def ci(session: nox.Session) -> None:
    """What CI runs: lint, then every package's tests and the integration tests, in one env."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    _install_local(session, "colossal-stack", editable=True, all_tests=True)
    session.install("import-linter>=2.0", "pytest-xdist>=3.5")
    session.run("lint-imports", "--no-cache")  # the package arrows (see the lint session)
    # two pytest workers over every suite (a run's tests wait on their processes about a third
    # of the time: one worker kept 0.7 of the two cores busy); each worker spawns each world
    # size (colossal_testing) once for all the suites it runs
    suites = [f"packages/{package}/tests" for package in PACKAGES] + ["integration_tests"]
    session.run(
        "pytest", "-q", "-n", "2", "--durations=15", "-m", "not outside_ci", *suites,
        *session.posargs,
    )  # fmt: skip
