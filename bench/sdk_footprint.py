"""Installed size and import cost of the SDK: build the wheel, install it into a fresh venv, measure.

Usage: python bench/sdk_footprint.py [--extras server] [--repeat 5]
Prints the site-packages size (MB, with every dependency), the distributions installed, the
number of modules ``import deniable.client`` loads and its median wall time over ``--repeat``
runs (each in a new interpreter). Reuses the pip cache; needs the network or a local index.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import sys, time; t = time.perf_counter(); import deniable.client; "
    "print(time.perf_counter() - t, len(sys.modules))"
)


def build_wheel(out: Path) -> Path:
    """The project's wheel, built without build isolation (setuptools from this interpreter)."""
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out)]
    subprocess.run([*cmd, str(ROOT)], check=True, capture_output=True)
    return next(out.glob("deniable-*.whl"))


def install(venv: Path, wheel: Path, extras: str) -> Path:
    """A fresh venv with the wheel (and ``extras``) installed; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    target = f"deniable[{extras}] @ {wheel.as_uri()}" if extras else str(wheel)
    subprocess.run([str(python), "-m", "pip", "install", "-q", target], check=True)
    return python


def site_packages_mb(python: Path) -> float:
    """Size of the venv's site-packages without pip and setuptools themselves."""
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import site; print(site.getsitepackages()[0])"], text=True
        ).strip()
    )
    skip = ("pip", "setuptools", "_distutils_hack", "pkg_resources")
    total = sum(
        f.stat().st_size
        for f in site.rglob("*")
        if f.is_file() and not f.relative_to(site).parts[0].startswith(skip)
    )
    return total / 1e6


def main() -> None:
    """Measure one installation and print a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--extras", default="")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp))
        python = install(Path(tmp) / "venv", wheel, args.extras)
        probe = [str(python), "-c", PROBE]
        runs = [subprocess.check_output(probe, text=True).split() for _ in range(args.repeat)]
        dists = subprocess.check_output([str(python), "-m", "pip", "list", "--format=json"], text=True)
        print(
            json.dumps(
                {
                    "extras": args.extras,
                    "site_packages_mb": round(site_packages_mb(python), 1),
                    "import_s_median": round(statistics.median(float(t) for t, _ in runs), 3),
                    "modules": int(runs[0][1]),
                    "distributions": sorted(d["name"] for d in json.loads(dists)),
                }
            )
        )


if __name__ == "__main__":
    main()
