"""A throwaway PostgreSQL cluster for the results database's tests (docs/decisions/results-db.md).

`.ci/run` starts one for the whole suite and exports its URL as BMOE_TEST_PG_URL; without it,
`pg_url` starts its own when PostgreSQL's server binaries are on this host (PATH, or Debian's
/usr/lib/postgresql/*/bin), in a temporary folder, on 127.0.0.1 at a free port and a unix socket
in that folder, and stops and removes it at the session's end. As root the server runs as
`postgres` (initdb refuses root), else as the user. Each test gets a database of its own, dropped
afterwards. With neither, the tests skip, saying why (a host facility missing).

`python -m tests.results.pg start FOLDER` / `stop FOLDER` do the same from a shell.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "BMOE_TEST_PG_URL"
USER = "bmoe"


def binaries() -> Path | None:
    """The folder of initdb and pg_ctl, or None."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name)
                      if p.parent.parent.name.isdigit() else 0)
    return versions[-1].parent if versions else None


def _as_server_user(folder: Path) -> list[str]:
    if os.geteuid() != 0:
        return []
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        return ["runuser", "-u", name, "--"]
    raise RuntimeError("running as root and no postgres or nobody user to run the server as")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(folder: Path) -> str:
    """A cluster in `folder` (made; empty), started; its URL."""
    bin_dir = binaries()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl) on this host")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    run_as = _as_server_user(folder)
    data, port = folder / "data", _free_port()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "check": True, "cwd": folder}
    subprocess.run([*run_as, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", USER, "-E", "UTF8",
                    "--no-locale", "--no-sync"], **quiet)
    options = (f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
               "-c full_page_writes=off")
    subprocess.run([*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w",
                    "-t", "60", "-o", options, "start"], **quiet)
    (folder / "url").write_text(f"postgresql://{USER}@127.0.0.1:{port}/postgres\n")
    return (folder / "url").read_text().strip()


def stop(folder: Path) -> None:
    """Stop the cluster in `folder` (if it runs) and remove the folder."""
    bin_dir = binaries()
    data = folder / "data"
    if bin_dir is not None and (data / "postmaster.pid").exists():
        run_as = ["runuser", "-u", data.owner(), "--"] if os.geteuid() == 0 and data.owner() != "root" else []
        subprocess.run([*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd="/")
    shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def database(server_url: str) -> Iterator[str]:
    """A fresh database on the server (dropped afterwards); its URL."""
    import psycopg

    name = f"bmoe_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: python -m tests.results.pg start|stop FOLDER")
    if sys.argv[1] == "start":
        print(start(Path(sys.argv[2])))
    else:
        stop(Path(sys.argv[2]))
