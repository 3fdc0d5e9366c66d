"""A throwaway PostgreSQL server for tests and benchmarks: initdb into a temp dir, pg_ctl on loopback.

Not a test module and not a conftest: conftests and scripts load it by path (see
tests/aggregator/conftest.py), since the tests run in importlib mode and ``tests`` is not a
package. Server binaries come from ``$DENIABLE_PG_BINDIR``, the directory of ``pg_ctl`` on PATH,
or the newest ``/usr/lib/postgresql/*/bin`` (Debian's ``postgresql`` package, installed by
scripts/system-deps.sh). As root the server runs as the ``postgres`` system user (``runuser``);
otherwise as the current user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import asyncpg

from support.processes import free_port

INSTALL_HINT: Final = "run scripts/system-deps.sh"
SUPERUSER: Final = "postgres"
START_ATTEMPTS: Final = 3

FAST_SETTINGS: Final = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
"""For tests: a crash of the test server loses nothing anyone needs, so skip the flushes."""


class PostgresUnavailable(RuntimeError):
    """The server binaries are missing or the server would not start (message is one line)."""


def find_bindir() -> Path | None:
    """The directory holding initdb and pg_ctl, or None."""
    candidates: list[Path] = []
    if os.environ.get("DENIABLE_PG_BINDIR"):
        candidates.append(Path(os.environ["DENIABLE_PG_BINDIR"]))
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    return None


@dataclass
class PostgresServer:
    """A running server owned by this process: superuser ``postgres`` with a random password."""

    root: Path
    bindir: Path
    port: int
    password: str
    run_as: tuple[str, ...]

    @classmethod
    def start(cls, *, durable: bool = False) -> PostgresServer:
        """initdb + pg_ctl start; ``durable`` keeps fsync on (benchmarks), otherwise fast settings."""
        bindir = find_bindir()
        if bindir is None:
            raise PostgresUnavailable(
                f"PostgreSQL server binaries (initdb, pg_ctl) not found: {INSTALL_HINT}"
            )
        run_as: tuple[str, ...] = ()
        owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:  # the server refuses to run as root
            try:
                owner = pwd.getpwnam(SUPERUSER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root but there is no '{SUPERUSER}' system user: {INSTALL_HINT}"
                ) from None
            run_as = ("runuser", "-u", SUPERUSER, "--")
        root = Path(tempfile.mkdtemp(prefix="deniable-pg-"))
        password = secrets.token_hex(16)
        server = cls(root, bindir, 0, password, run_as)
        try:
            if owner is not None:
                os.chown(root, owner.pw_uid, owner.pw_gid)
            pwfile = root / "pwfile"
            pwfile.write_text(password + "\n")
            if owner is not None:
                os.chown(pwfile, owner.pw_uid, owner.pw_gid)
            server._run(
                "initdb",
                "-D",
                str(server.data),
                "-U",
                SUPERUSER,
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--no-locale",
                "-E",
                "UTF8",
                "--no-sync",
            )
            pwfile.unlink()
            base = (server.data / "postgresql.conf").read_text()
            settings = {"listen_addresses": "'127.0.0.1'", "unix_socket_directories": f"'{root}'"}
            if not durable:
                settings.update(FAST_SETTINGS)
            for attempt in range(START_ATTEMPTS):
                server.port = free_port()
                lines = [f"{k} = {v}" for k, v in {**settings, "port": str(server.port)}.items()]
                (server.data / "postgresql.conf").write_text(base + "\n" + "\n".join(lines) + "\n")
                try:
                    server._run(
                        "pg_ctl", "-D", str(server.data), "-l", str(server.log), "-w", "-t", "60", "start"
                    )
                    break
                except PostgresUnavailable:
                    if attempt + 1 == START_ATTEMPTS or "already in use" not in server.log_tail():
                        raise
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.root / "data"

    @property
    def log(self) -> Path:
        """The server's log file."""
        return self.root / "server.log"

    def log_tail(self, lines: int = 5) -> str:
        """The end of the server log as one line (for error messages)."""
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def _run(self, tool: str, *args: str) -> None:
        """Run one server binary (as the server's user); PostgresUnavailable if it fails."""
        result = subprocess.run(
            [*self.run_as, str(self.bindir / tool), *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            output = " ".join((result.stderr or result.stdout).split())
            raise PostgresUnavailable(
                f"{tool} failed ({result.returncode}): {output} {self.log_tail()}".strip()
            )

    def dsn(self, database: str = "postgres") -> str:
        """A DSN for the superuser on ``database``."""
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    async def create_database(self, prefix: str = "t") -> str:
        """Create an empty database with a fresh name; return its name."""
        name = f"{prefix}_{secrets.token_hex(6)}"
        admin = await asyncpg.connect(self.dsn())
        try:
            await admin.execute(f'CREATE DATABASE "{name}" STRATEGY FILE_COPY')
        finally:
            await admin.close()
        return name

    async def drop_database(self, name: str) -> None:
        """Drop a database, ending any sessions still connected to it."""
        admin = await asyncpg.connect(self.dsn())
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory; safe to call twice."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(PostgresUnavailable, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
