"""Installed size and import cost of the SDK: the engine of ``bench/sdk_footprint.py``.

Builds the project's wheel, installs it into a fresh venv (reusing pip's cache; needs the network
or a local index) and measures site-packages and ``import deniable.client`` there.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE = (
    "import sys, time; t = time.perf_counter(); import deniable.client; "
    "print(time.perf_counter() - t, len(sys.modules))"
)
TOOLING = ("pip", "setuptools", "_distutils_hack", "pkg_resources")


def run(*argv: str | Path) -> str:
    """Run a command of this module's own making (no shell, no outside input); its stdout.

    Its stderr (pip's chatter) is shown only when it fails, in the error.
    """
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


@dataclass
class FootprintConfig:
    """The project to build, the extras to install with it, and import timings to take."""

    project: Path
    extras: str = ""
    repeat: int = 5


def build_wheel(project: Path, out: Path) -> Path:
    """The project's wheel, built without build isolation (setuptools from this interpreter)."""
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, project)
    return next(out.glob("deniable-*.whl"))


def install(venv: Path, wheel: Path, extras: str) -> Path:
    """A fresh venv with the wheel (and ``extras``) installed; its python."""
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    target = f"deniable[{extras}] @ {wheel.as_uri()}" if extras else str(wheel)
    run(python, "-m", "pip", "install", "-q", target)
    return python


def site_packages_mb(python: Path) -> float:
    """Size of the interpreter's site-packages without pip and setuptools themselves."""
    return sum(package_sizes_mb(python).values())


def package_sizes_mb(python: Path) -> dict[str, float]:
    """MB per top-level entry of site-packages (``nacl``, ``google``, ``deniable``, their
    ``.dist-info``), without pip and setuptools: where an installation's size comes from."""
    site = Path(run(python, "-c", "import site; print(site.getsitepackages()[0])").strip())
    sizes: dict[str, int] = {}
    for f in site.rglob("*"):
        top = f.relative_to(site).parts[0]
        if f.is_file() and not top.startswith(TOOLING):
            sizes[top] = sizes.get(top, 0) + f.stat().st_size
    return {top: size / 1e6 for top, size in sizes.items()}


def import_cost(python: Path, repeat: int) -> tuple[float, int]:
    """Median seconds of ``import deniable.client`` over ``repeat`` new interpreters, and modules loaded."""
    runs = [run(python, "-c", PROBE).split() for _ in range(repeat)]
    return statistics.median(float(t) for t, _ in runs), int(runs[0][1])


def measure(python: Path, extras: str, repeat: int) -> dict[str, Any]:
    """The footprint of the installation behind ``python``."""
    seconds, modules = import_cost(python, repeat)
    dists = run(python, "-m", "pip", "list", "--format=json")
    sizes = package_sizes_mb(python)
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:8]
    return {
        "extras": extras,
        "site_packages_mb": round(sum(sizes.values()), 1),
        "largest_mb": {top: round(mb, 2) for top, mb in largest},
        "import_s_median": round(seconds, 3),
        "modules": modules,
        "distributions": sorted(d["name"] for d in json.loads(dists)),
    }


def run_footprint(config: FootprintConfig) -> dict[str, Any]:
    """Build, install into a throwaway venv, measure."""
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(config.project, Path(tmp))
        python = install(Path(tmp) / "venv", wheel, config.extras)
        return measure(python, config.extras, config.repeat)
