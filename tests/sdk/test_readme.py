"""The README's device SDK snippets run as written against a real shuffler and aggregator.

Every ```python block of the "Device SDK" section runs in its own directory and interpreter;
the only changes are the shuffler's addresses (the test's free ports instead of 127.0.0.1:7701 for
gRPC and 127.0.0.1:7703 for HTTPS) and the pinned signing key (the test aggregator's instead of
the placeholder).
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from support.sdk_services import binary_campaign, counted, running_services

from deniable.shuffler.https import HttpsConfig

README = Path(__file__).resolve().parents[2] / "README.md"
WRITTEN_ADDRESS = "127.0.0.1:7701"
WRITTEN_HTTPS = "127.0.0.1:7703"
WRITTEN_KEY = '"…"'


def sdk_snippets() -> list[str]:
    """The python code blocks between '## Device SDK' and the next section."""
    text = README.read_text()
    section = text[text.index("## Device SDK") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_section_has_a_sync_and_an_async_snippet() -> None:
    snippets = sdk_snippets()
    assert len(snippets) >= 2
    assert any("SyncReporter" in s for s in snippets) and any("asyncio.run" in s for s in snippets)
    assert all((WRITTEN_ADDRESS in s or WRITTEN_HTTPS in s) and WRITTEN_KEY in s for s in snippets)
    assert any("HttpTransport" in s for s in snippets) and any("GrpcTransport" in s for s in snippets)


async def test_readme_snippets_run_and_their_reports_are_counted(tmp_path: Path) -> None:
    """Each snippet sends one report (its own outbox and budget); the aggregator counts them all."""
    snippets = sdk_snippets()
    https = HttpsConfig(listen="127.0.0.1:0")
    async with running_services(tmp_path, [binary_campaign("dark-mode")], https=https) as services:
        assert services.shuffler is not None and services.shuffler.https_address is not None
        for number, snippet in enumerate(snippets):
            workdir = tmp_path / f"snippet{number}"
            workdir.mkdir()
            (workdir / "certs").symlink_to(services.certs)
            code = snippet.replace(WRITTEN_ADDRESS, services.shuffler_address)
            code = code.replace(WRITTEN_HTTPS, services.shuffler.https_address)
            code = code.replace(WRITTEN_KEY, repr(services.signing_key))
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                code,
                cwd=workdir,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, f"snippet {number}:\n{snippet}\n{err.decode()}"
            assert out.decode().strip() == "1 sent, 0 still queued"
        answer = await counted(services, "dark-mode", len(snippets))
        assert (answer.n, answer.rejected) == (len(snippets), 0)
