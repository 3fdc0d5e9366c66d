"""What the service images carry (issue 23 item 1, ADR 0036): the aggregator and the shuffler run
without scipy, aiohttp (and its helpers) and PyNaCl, which deploy/Dockerfile's ``build-server``
stage leaves out (scipy is not even in ``[server]``).

Each probe runs in a fresh interpreter with those packages made unimportable
(``sys.modules[name] = None``), imports every module of the service-side packages and computes a
GRR guarantee through the full privacy blanket at n = 200,000, where it takes the blocked path whose
Bin(t, 1/2) tails used scipy until round 16.
Deterministic: no randomness, no timing.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("scipy", "aiohttp", "nacl", "multidict", "yarl", "frozenlist", "aiosignal")
# Service-side packages; console/ is the [console] extra's aiohttp application (not in the images'
# venv: `deniable console` there says which extra to install).
PACKAGES = ("aggregator", "shuffler", "core", "cli", "client", "admin", "sim")
NOT_IN_SERVICE_IMAGES = ("deniable.core.audit",)  # dev-only (needs scipy; documented there)

PROBE = """
import importlib, pkgutil, sys
for name in {blocked!r}:
    sys.modules[name] = None
failed = []
for package in {packages!r}:
    root = importlib.import_module("deniable." + package)
    for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
        if info.name.endswith("__main__") or info.name in {skipped!r}:
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            failed.append(f"{{info.name}}: {{exc}}")
{extra}
from deniable.core import mechanisms
bound = mechanisms.create("grr", epsilon0=4.0, domain_size=16).central_guarantee(200_000, 1e-6)
assert "full privacy blanket" in bound.analysis, bound.analysis
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r} and sys.modules[m] is not None)
print("FAILED", failed)
print("LOADED", loaded)
print("EPSILON", bound.epsilon)
"""


def _probe(extra: str = "", skipped: tuple[str, ...] = NOT_IN_SERVICE_IMAGES) -> dict[str, str]:
    """Run the probe; its three result lines, by label."""
    code = PROBE.format(blocked=BLOCKED, packages=PACKAGES, skipped=skipped, extra=extra)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def test_service_modules_import_and_account_without_scipy_aiohttp_or_pynacl() -> None:
    found = _probe()
    assert found["FAILED"] == "[]" and found["LOADED"] == "[]"
    assert 0 < float(found["EPSILON"]) < 4.0  # amplified below epsilon0


def test_the_probe_sees_a_module_that_needs_a_blocked_package() -> None:
    """The same probe, reaching core/audit.py's scipy (imported when a bound is computed): it fails there."""
    extra = (
        "from deniable.core import audit\n"
        "try:\n    audit.clopper_pearson_lower(5, 10, 0.05)\n"
        "except ImportError as exc:\n    failed.append(f'deniable.core.audit: {exc}')\n"
    )
    found = _probe(extra=extra, skipped=())
    assert "deniable.core.audit" in found["FAILED"] and "scipy" in found["FAILED"]


def test_the_server_extras_leave_scipy_out() -> None:
    """The images install [server,postgres,mqtt]; scipy is [dev] only (core/audit.py, test references)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("server", "postgres", "mqtt"):
        assert not [r for r in extras[extra] if r.lower().startswith("scipy")], extra
    assert [r for r in extras["dev"] if r.startswith("scipy")]


def test_the_accountant_never_loads_scipy_even_where_installed() -> None:
    """With scipy importable (the dev install), computing the guarantee still does not load it: the
    tails are our own (before round 16 the accountant imported scipy.special whenever it could)."""
    pytest.importorskip("scipy")
    code = (
        "import sys, deniable.aggregator.server\n"
        "from deniable.core import mechanisms\n"
        "mechanisms.create('grr', epsilon0=4.0, domain_size=16).central_guarantee(200_000, 1e-6)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
