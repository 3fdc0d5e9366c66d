"""Differential cases for client-ts/test/differential.test.mjs, made by the Python core itself.

Prints JSON: for a grid of mechanisms, epsilon0, domain sizes and parameters wider than
tests/vectors (every OLH field size up to 27, default subset sizes, odd domains, small and large
epsilon0), the thresholds the Python randomiser holds and payloads with the exact bytes it read
from a recording CSPRNG. Run with the repository's venv: ``python client-ts/test/python_cases.py``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from make_vectors import RecordingRng, thresholds

from deniable.core import mechanisms

GRID: list[tuple[str, float, int, dict[str, float]]] = [
    *[("binary_rr", e, 2, {}) for e in (0.1, 0.7, 1.5, 3.3, 7.9, 20.0)],
    *[("grr", e, d, {}) for e in (0.25, 2.0, 6.0) for d in (2, 3, 17, 257)],
    *[(m, e, d, {}) for m in ("sue", "oue") for e in (0.3, 1.0, 4.5) for d in (2, 9, 33)],
    *[("subset_selection", e, d, {}) for e in (0.5, 1.0, 2.5) for d in (4, 10, 40)],
    ("subset_selection", 1.0, 12, {"subset_size": 5.0}),
    *[("hadamard_response", e, d, {}) for e in (0.5, 2.0) for d in (2, 3, 15, 16, 100)],
    *[("olh", 1.0, d, {"g": float(g)}) for g in (2, 3, 4, 5, 7, 8, 9, 16, 25, 27) for d in (5, 30, 200)],
    ("olh", 2.0, 50, {}),
]


def main() -> None:
    out = []
    for name, epsilon0, d, params in GRID:
        randomiser = mechanisms.create(name, epsilon0=epsilon0, domain_size=d, **params)
        cases = []
        for case, value in enumerate(sorted({0, 1, d // 2, d - 1})):
            label = f"differential/{name}/{epsilon0}/{d}/{params}/{case}"
            rng = RecordingRng(hashlib.sha256(label.encode()).digest())
            payload = randomiser.randomise(value, rng)
            cases.append({"value": value, "randomness": rng.served.hex(), "payload": payload.hex()})
        out.append(
            {
                "mechanism": name,
                "proto": int(randomiser.proto),
                "epsilon0": epsilon0,
                "domain_size": d,
                "params": params,
                "payload_length": randomiser.payload_length,
                "thresholds": {k: str(v) for k, v in thresholds(randomiser).items()},
                "cases": cases,
            }
        )
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
