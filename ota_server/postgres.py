"""A real PostgreSQL server on loopback for the tests and the benchmarks (like :class:`LocalMosquitto`).

:class:`LocalPostgres` runs the Debian ``postgresql`` package's binaries (``initdb`` and
``postgres``; Debian keeps them in ``/usr/lib/postgresql/<major>/bin``, off PATH): a fresh
cluster in ``workdir/data``, trust authentication for 127.0.0.1 only, listening on 127.0.0.1
and on a unix socket inside the work directory, on a free port::

    with LocalPostgres(tmp_path, durable=False) as pg:
        url = pg.create_database("fleet_test")     # postgresql://postgres@127.0.0.1:PORT/fleet_test

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` system user
the Debian package creates. It needs psycopg 3 (the ``[server]`` extra) to wait for readiness
and to create databases.

To try replicas without a database server of your own (docs/deploy.md)::

    python -m edgesdk.ota_server.postgres pg --port 5432 --database fleet &

prints ``ready: postgresql://postgres@127.0.0.1:5432/fleet`` and serves until it is stopped
(SIGTERM or Ctrl-C). It is a throwaway: trust authentication on loopback, no tuning.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from edgesdk.errors import EdgeSDKError
from edgesdk.ota_server.broker import free_port

__all__ = ["LocalPostgres", "postgres_bindir", "INSTALL_HINT", "main"]

#: How to get the binaries on Debian/Ubuntu (scripts/setup.sh does it as root).
INSTALL_HINT = "apt-get install -y postgresql"

_SYSTEM_USER = "postgres"
_DATABASE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# A unix socket path must fit in sun_path (108 bytes) with "/.s.PGSQL.NNNNN" appended.
_MAX_SOCKET_DIR = 90
_NOT_DURABLE = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def postgres_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres`` (PATH first, then the newest /usr/lib/postgresql/*/bin)."""
    found = shutil.which("initdb")
    if found:
        bindir = Path(os.path.realpath(found)).parent
        if (bindir / "postgres").exists():
            return bindir
    candidates = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    candidates = [c for c in candidates if (c / "postgres").exists()]
    if not candidates:
        return None
    return max(candidates, key=lambda c: _major(c.parent.name))


def _major(name: str) -> int:
    return int(name) if name.isdigit() else -1


class LocalPostgres:
    """A PostgreSQL server on 127.0.0.1 in ``workdir``; stop it with :meth:`stop` or use it as a context manager.

    ``durable=False`` turns off fsync, synchronous commit and full-page writes: much faster,
    and a machine crash may lose the cluster, which tests do not care about. ``settings``
    adds ``-c NAME=VALUE`` server options (e.g. ``{"max_connections": "200"}``).
    """

    def __init__(self, workdir: str | os.PathLike[str], port: int | None = None, durable: bool = True,
                 settings: Mapping[str, str] | None = None, start_timeout_s: float = 60.0) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise EdgeSDKError(f"PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin): "
                               f"`{INSTALL_HINT}` (scripts/setup.sh does it as root)")
        self.bindir, self.port, self.durable = bindir, port or free_port(), durable
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "postgres.log"
        self.settings = {**(_NOT_DURABLE if not durable else {}), **(settings or {})}
        self._user = _system_user() if os.geteuid() == 0 else None
        self._scratch: Path | None = None  # a private directory outside workdir, removed by stop()
        self.data, self.socket_dir = self._layout()
        self.process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._initdb()
        self.start(start_timeout_s)

    @property
    def url(self) -> str:
        """The superuser's address of the default database: ``postgresql://postgres@127.0.0.1:PORT/postgres``."""
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        """The address of database ``name`` on this server (as the ``postgres`` superuser, no password)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the server and return once it accepts connections; EdgeSDKError with the log's tail otherwise."""
        if self.process is not None and self.process.poll() is None:
            return
        command = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                   "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.socket_dir}"]
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            **self._as_user())
        self._finalizer = weakref.finalize(self, _shutdown, self.process, 10.0)
        self._wait_ready(timeout_s)

    def restart(self, down_s: float = 0.0, timeout_s: float = 60.0) -> None:
        """Fast shutdown, ``down_s`` seconds down, then start again on the same port and data (a database restart
        as its clients see it: their connections drop, and committed data stays)."""
        if self.process is not None:
            _shutdown(self.process, 10.0)
        time.sleep(down_s)
        self.process = None
        self.start(timeout_s)

    def create_database(self, name: str) -> str:
        """Create an empty database ``name`` (lower-case letters, digits, ``_``) and return its URL."""
        if not _DATABASE_NAME.match(name):
            raise EdgeSDKError(f"database name {name!r} is not a plain identifier; use up to 63 lower-case letters, "
                               "digits and '_', starting with a letter or '_'")
        with self._connect(self.url) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def drop_database(self, name: str, force: bool = True) -> None:
        """Drop database ``name``; nothing happens when it does not exist.

        ``force`` closes its open connections first; without it a database in use raises
        ``psycopg.errors.ObjectInUse`` and stays.
        """
        if not _DATABASE_NAME.match(name):
            raise EdgeSDKError(f"database name {name!r} is not a plain identifier (see create_database)")
        with self._connect(self.url) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}"' + (" WITH (FORCE)" if force else ""))

    def stop(self) -> None:
        """Fast shutdown (open transactions roll back) and wait for the server to exit; safe to call twice."""
        if self._finalizer is not None:
            self._finalizer()  # runs _shutdown once, and not again at interpreter exit
        self.process = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> LocalPostgres:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # internals -----------------------------------------------------------------------------
    def _layout(self) -> tuple[Path, Path]:
        """The data and socket directories: inside workdir when the server's user can reach it and the path is short."""
        data, sockets = self.workdir / "data", self.workdir / "run"
        if self._user is not None and not _reachable(self.workdir, self._user):
            # pytest's temp dirs are 0700 root: the postgres user could not even look inside.
            self._scratch = Path(tempfile.mkdtemp(prefix="edgesdk-pg-"))
            data, sockets = self._scratch / "data", self._scratch / "run"
            (self.workdir / "data-location").write_text(f"{data}\n")
        elif len(str(sockets)) > _MAX_SOCKET_DIR:
            self._scratch = Path(tempfile.mkdtemp(prefix="edgesdk-pg-"))
            sockets = self._scratch
        for folder in (data.parent, sockets):
            folder.mkdir(parents=True, exist_ok=True)
            if self._user is not None:
                os.chown(folder, self._user[0], self._user[1])
        return data, sockets

    def _initdb(self) -> None:
        command = [str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                   "--locale=C"]
        if not self.durable:
            command.append("--no-sync")
        if self._user is not None:
            os.chown(self.workdir, self._user[0], self._user[1])
        with open(self.log, "ab") as log:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False,
                                  **self._as_user())
        if done.returncode != 0:
            raise EdgeSDKError(f"initdb failed (exit {done.returncode}) for {self.data}: {_tail(self.log)}")
        # Only loopback, no passwords: tests and benchmarks, never a shared machine's network.
        (self.data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")

    def _as_user(self) -> dict[str, Any]:
        """Popen arguments that drop root to the postgres system user (nothing when not root)."""
        if self._user is None:
            return {}
        uid, gid = self._user
        return {"user": uid, "group": gid, "extra_groups": [], "env": {**os.environ, "HOME": str(self.workdir)}}

    def _wait_ready(self, timeout_s: float) -> None:
        psycopg = _psycopg()
        deadline = time.monotonic() + timeout_s
        error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                self.stop()
                raise EdgeSDKError(f"PostgreSQL exited during start-up on 127.0.0.1:{self.port}: {_tail(self.log)}")
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:  # refused, or "the database system is starting up"
                error = exc
                time.sleep(0.05)
        self.stop()
        raise EdgeSDKError(f"PostgreSQL did not accept connections on 127.0.0.1:{self.port} within {timeout_s:g} s "
                           f"({error}): {_tail(self.log)}")

    def _connect(self, url: str) -> Any:
        if self.process is None or self.process.poll() is not None:
            raise EdgeSDKError(f"the PostgreSQL server of {self.workdir} is not running; call start() first")
        return _psycopg().connect(url, autocommit=True, connect_timeout=10)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise EdgeSDKError("LocalPostgres needs psycopg 3: pip install 'edgesdk[server]' "
                           "(or pip install 'psycopg[binary]>=3.1')") from exc
    return psycopg


def _system_user() -> tuple[int, int]:
    """uid and gid of the ``postgres`` system user (root may not run PostgreSQL)."""
    import pwd

    try:
        entry = pwd.getpwnam(_SYSTEM_USER)
    except KeyError:
        raise EdgeSDKError(f"running as root, PostgreSQL must run as the '{_SYSTEM_USER}' user, and there is none: "
                           f"`{INSTALL_HINT}` creates it (or run the tests as a normal user)") from None
    return entry.pw_uid, entry.pw_gid


def _reachable(path: Path, user: tuple[int, int]) -> bool:
    """Whether ``user`` may traverse every directory above ``path`` (mode bits only; enough for temp dirs)."""
    uid, gid = user
    for folder in path.parents:
        info = folder.stat()
        bit = 0o100 if info.st_uid == uid else 0o010 if info.st_gid == gid else 0o001
        if not info.st_mode & bit:
            return False
    return True


def _shutdown(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGINT is PostgreSQL's fast shutdown, SIGQUIT its immediate one; SIGKILL last (its backends exit with it)."""
    for stop in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):
        if process.poll() is not None:
            return
        process.send_signal(stop)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            continue


def _tail(log: Path, size: int = 600) -> str:
    try:
        return log.read_text(errors="replace")[-size:].strip() or "(empty log)"
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> None:
    """``python -m edgesdk.ota_server.postgres DIR [--port P] [--database NAME]``: a throwaway PostgreSQL in DIR."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m edgesdk.ota_server.postgres",
                                     description="A throwaway PostgreSQL on 127.0.0.1 for trying edgesdk replicas.")
    parser.add_argument("dir", help="where its cluster lives (created)")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--database", default="fleet", help="a database to create, empty")
    args = parser.parse_args(argv)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server = LocalPostgres(args.dir, port=args.port)
    except EdgeSDKError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        url = server.create_database(args.database)
        print(f"ready: {url}", flush=True)
        while not stopping and server.process is not None and server.process.poll() is None:
            time.sleep(0.2)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
