"""The wheel installs only the ``deniable`` namespace: no generic ``client`` or ``proto`` module."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from support.wheels import build_wheel

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_holds_only_the_deniable_namespace(tmp_path: Path) -> None:
    build_wheel(tmp_path)
    wheels = list(tmp_path.glob("deniable-*.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    top_levels = {name.split("/", 1)[0] for name in names}
    assert {t for t in top_levels if not t.endswith(".dist-info")} == {"deniable"}
    for required in (
        "deniable/core/rng.py",
        "deniable/core/mechanisms/direct.py",
        "deniable/v1/deniable_pb2.py",
        "deniable/v1/deniable_pb2_grpc.pyi",
        "deniable/client/reporter.py",
        "deniable/client/http_transport.py",
        "deniable/client/grpc_transport.py",
        "deniable/shuffler/https.py",
        "deniable/shuffler/spool.py",
        "deniable/aggregator/store.py",
        "deniable/cli/main.py",
        "deniable/console/app.py",
        "deniable/console/static/console.css",
        "deniable/console/static/console.js",
        "deniable/console/static/favicon.svg",
        "deniable/core/py.typed",
    ):
        assert required in names, required
    assert "deniable/__init__.py" not in names  # an implicit namespace package (ADR 0001)


def test_grpcio_is_an_extra_not_a_requirement(tmp_path: Path) -> None:
    """The bare install needs no grpcio (ADR 0033): it is in [grpc] and [server] only."""
    build_wheel(tmp_path)
    wheel = zipfile.ZipFile(next(tmp_path.glob("deniable-*.whl")))
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = [
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    bare = sorted(re.split(r"[<>=!~;\s]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r)
    assert bare == ["protobuf", "pynacl"], bare  # cryptography is [server]/[grpc] (ADR 0039)
    grpc_extras = {r.split("extra ==")[1].strip().strip("'\"") for r in requires if r.startswith("grpcio>")}
    assert {"grpc", "server"} <= grpc_extras, grpc_extras
