"""Where a big rollout's cost goes: one rollout to 10,000 simulated devices on PostgreSQL, profiled from the push
to the rollout's completion.

- The server process is sampled by py-spy (``py-spy record --format raw``, 50 Hz, GIL or not): the functions
  holding the most samples (inclusive, as a share of all samples), and the innermost frames.
- PostgreSQL counts every statement with ``pg_stat_statements`` (preloaded in the benchmark's own cluster, reset
  at the push): the statements by total execution time, with calls, rows and mean time.

Run it on two commits to see what a change did to where the time goes (the issue's "profile before and after").

    python benchmarks/fleet/fleet_profile.py [--devices 10000] [--replicas 1] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.fleet.fleet import Run, make_bundles  # noqa: E402
from benchmarks.shared.common import emit, goal, log  # noqa: E402
from edgesdk.fleet.records import TargetStatus  # noqa: E402
from edgesdk.ota_server.postgres import LocalPostgres  # noqa: E402
from edgesdk.runtime.signing import generate_keypair  # noqa: E402


def py_spy() -> str | None:
    """The py-spy executable beside this Python (the dev extra installs it) or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def summarize_samples(raw: Path, top: int) -> dict[str, Any]:
    """py-spy's raw output (``frame;frame;... count`` per line) as inclusive and innermost shares."""
    inclusive: collections.Counter[str] = collections.Counter()
    innermost: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), [f.split(" (")[0] for f in stack.split(";")]
        total += n
        for name in set(frames):
            inclusive[name] += n
        innermost[frames[-1]] += n
    if not total:
        return {"samples": 0}

    def shares(counter: collections.Counter[str]) -> list[list[Any]]:
        return [[name, round(n / total, 4)] for name, n in counter.most_common(top)]

    skip = ("Thread.", "threading.", "_bootstrap")  # every thread's own frames
    return {"samples": total,
            "inclusive": shares(collections.Counter({k: v for k, v in inclusive.items() if not k.startswith(skip)})),
            "innermost": shares(innermost)}


def top_statements(pg: LocalPostgres, database: str, top: int) -> list[dict[str, Any]]:
    """pg_stat_statements of ``database`` by total execution time."""
    import psycopg

    with psycopg.connect(pg.database_url(database), autocommit=True) as connection:
        rows = connection.execute(
            "SELECT calls, total_exec_time, rows, query FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s ORDER BY total_exec_time DESC LIMIT %s", (database, top)).fetchall()
    return [{"calls": calls, "total_ms": round(total, 1), "mean_ms": round(total / calls, 4) if calls else None,
             "rows": n, "query": " ".join(query.split())[:300]} for calls, total, n, query in rows]


def profile(work: Path, devices: int, replicas: int, top: int) -> dict[str, Any]:
    generate_keypair(work / "keys", "server")
    generate_keypair(work / "keys", "converter")
    bundles = make_bundles(work)
    settings = {"max_connections": "100", "shared_preload_libraries": "pg_stat_statements",
                "pg_stat_statements.track": "all"}
    spy = py_spy()
    with LocalPostgres(work / "postgres", durable=True, settings=settings) as pg:
        url = pg.create_database("fleet_profile")
        import psycopg

        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        run = Run(work, "profile", devices, url, replicas)
        recorders: list[tuple[subprocess.Popen[bytes], Path]] = []
        try:
            run.connect()
            with psycopg.connect(url, autocommit=True) as connection:
                connection.execute("SELECT pg_stat_statements_reset()")
            if spy is not None:
                for server in run.servers:
                    out = work / f"{server.name}.raw"
                    recorders.append((subprocess.Popen(
                        [spy, "record", "--pid", str(server.process.pid), "--rate", "50", "--format", "raw",
                         "--nonblocking", "--output", str(out)], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL), out))
                time.sleep(1.0)  # py-spy attaches before the push
            started = time.monotonic()
            rollout_id = run.push(bundles["2.0.0"])
            r = run.wait(rollout_id, 600)
            wall = time.monotonic() - started
        finally:
            for recorder, _ in recorders:
                recorder.send_signal(2)  # SIGINT: py-spy writes what it has
            for recorder, _ in recorders:
                recorder.wait(timeout=60)
            run.close()
        statements = top_statements(pg, "fleet_profile", top)
    return {"devices": devices, "replicas": replicas, "wall_s": round(wall, 2), "state": r.state.value,
            "committed": r.count(TargetStatus.COMMITTED),
            "py_spy": {out.stem: summarize_samples(out, top) for _, out in recorders if out.exists()}
            if spy is not None else "py-spy is not installed (pip install -e .[dev])",
            "pg_stat_statements": statements}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=10000)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--top", type=int, default=25, help="how many functions and statements to list")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fleet-profile-"))
    try:
        log(f"profile: {args.devices} devices, {args.replicas} replica(s), PostgreSQL")
        result = profile(work, args.devices, args.replicas, args.top)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    goals = [goal(f"{args.devices} devices: the profiled rollout completed with every device committed", "report",
                  result["wall_s"], result["state"] == "completed" and result["committed"] == args.devices)]
    emit("fleet_profile", {"devices": args.devices, "replicas": args.replicas, "top": args.top}, result, goals)


if __name__ == "__main__":
    main()
