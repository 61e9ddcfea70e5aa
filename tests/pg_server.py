"""A real PostgreSQL server for the history's tests: Debian's ``postgresql`` (``scripts/install-test-tools.sh``),
started in a temporary directory on a loopback port with password authentication, as an
unprivileged user when the tests run as root (``initdb`` and ``pg_ctl`` refuse root: ``nobody``,
through ``runuser``), and stopped afterwards. ``server()`` is None where it is not installed."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

USER = "phasetrace"


def bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(dirs[-1]).parent if dirs else None


@dataclass
class Server:
    root: Path
    port: int
    password: str
    bin: Path

    def dsn(self, db: str = "postgres", password: str | None = None) -> str:
        return f"postgresql://{USER}:{password or self.password}@127.0.0.1:{self.port}/{db}"

    def _as_owner(self, *argv: str) -> list[str]:
        return ["runuser", "-u", "nobody", "--", *argv] if os.geteuid() == 0 else list(argv)

    def ctl(self, action: str, timeout: float = 30) -> None:
        argv = [str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-w", "-t", str(int(timeout))]
        if action == "start":
            argv += ["-l", str(self.root / "log"), "start"]
        else:
            argv += ["-m", "fast", action]
        subprocess.run(self._as_owner(*argv), check=True, capture_output=True, timeout=timeout + 5)

    def create(self, db: str) -> str:
        """A new database (each test its own), its DSN."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{db}"')
        return self.dsn(db)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start() -> Server | None:
    """initdb + pg_ctl start in a new temporary directory; None without the server's binaries."""
    where = bindir()
    if where is None or (os.geteuid() == 0 and not shutil.which("runuser")):
        return None
    root = Path(tempfile.mkdtemp(prefix="phasetrace-pg-"))
    password = "pw-" + secrets.token_hex(8)
    (root / "pw").write_text(password + "\n")
    if os.geteuid() == 0:
        os.chmod(root, 0o700)
        shutil.chown(root, "nobody", "nogroup")
        shutil.chown(root / "pw", "nobody", "nogroup")
    server = Server(root, _free_port(), password, where)
    subprocess.run(
        server._as_owner(
            str(where / "initdb"),
            "-D",
            str(root / "data"),
            "-U",
            USER,
            "--auth=scram-sha-256",
            f"--pwfile={root / 'pw'}",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    with open(root / "data" / "postgresql.conf", "a") as f:
        f.write(
            f"listen_addresses = '127.0.0.1'\nport = {server.port}\nunix_socket_directories = '{root}'\n"
            "fsync = off\nmax_connections = 200\nshared_buffers = 32MB\n"
        )
    server.ctl("start")
    return server


def stop(server: Server) -> None:
    try:
        server.ctl("stop")
    except (subprocess.SubprocessError, OSError):
        pass
    shutil.rmtree(server.root, ignore_errors=True)
