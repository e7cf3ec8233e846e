"""Study throughput with 1, 2 and 4 worker processes (issue 6), on the default journal file
and on PostgreSQL.

    python benchmarks/bench_workers.py [--trials N] [--workers 1,2,4] [--study quickstart]
                                       [--sampler tpe] [--postgres URL] [--no-tracking]

``--postgres`` (default: ``$CROSSFLOW_TEST_POSTGRES``) is an admin URL of a server on which
the benchmark creates (and drops) one database per run; without it only the journal file is
measured.  ``eval "$(bash .ci/postgres.sh start)"`` starts a throwaway server (its settings:
``fsync=off``, as a test server; a production server with durable commits is slower per
write).  Each run is the user's command, ``crossflow study run STUDY --trials N --workers K
--sampler SAMPLER [--storage URL]``, in a fresh directory, every trial logged to MLflow
(SQLite in ``mlruns/``) unless ``--no-tracking``.  The sampler is TPE unless named: the figures measure
the storage and the workers, and the ``structured`` driver's local search proposes one point
at a time, which a second worker evaluates again rather than wait (docs/studies.md), so its
workers add duplicates rather than throughput.  Reported per run:

* ``trials_per_s``: N / (last trial's completion − first trial's start), from the storage:
  the workers' steady rate;
* ``wall_s``: the whole command (Python start-up, study set-up, worker start-up, MLflow
  drain and summary);
* ``cpu_s``: the CPU time (user + system) of the command's processes — the launcher, its
  workers and the MLflow logger, not the database server: with more workers than cores
  this, not the wall time, is what a change to the per-trial work moves.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import machine  # noqa: E402


def _database(admin: str, name: str, create: bool) -> str:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))


def run(study: str, trials: int, workers: int, storage: str | None,
        tracking: bool, sampler: str = "tpe") -> dict:
    import optuna

    from crossflow.search.storage import make_storage

    with tempfile.TemporaryDirectory(prefix="crossflow-bench-") as cwd:
        cmd = [sys.executable, "-m", "crossflow", "study", "run", study, "--trials",
               str(trials), "--workers", str(workers), "--sampler", sampler, "--quiet"]
        if storage:
            cmd += ["--storage", storage]
        if not tracking:
            cmd.append("--no-tracking")
        t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
        url = storage or str(Path(cwd) / "mlruns" / "optuna" / f"{study}.journal")
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        trials_ = [t for t in optuna.load_study(study_name=study,
                                                storage=make_storage(url)).trials
                   if t.state.name == "COMPLETE"]
        span = (max(t.datetime_complete for t in trials_)
                - min(t.datetime_start for t in trials_)).total_seconds()
    return {"workers": workers, "trials": len(trials_), "trials_per_s": round(len(trials_)
                                                                            / span, 1),
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--study", default="quickstart")
    ap.add_argument("--sampler", default="tpe")
    ap.add_argument("--postgres", default=os.environ.get("CROSSFLOW_TEST_POSTGRES"))
    ap.add_argument("--no-tracking", action="store_true")
    args = ap.parse_args()
    ks = [int(k) for k in args.workers.split(",")]
    result: dict = {"machine": machine(), "cores": os.cpu_count(), "study": args.study,
                    "sampler": args.sampler, "trials": args.trials,
                    "mlflow": not args.no_tracking, "runs": {}}
    storages = [("journal", None)] + ([("postgresql", args.postgres)] if args.postgres
                                      else [])
    for label, admin in storages:
        rows = []
        for k in ks:
            url = None
            name = f"crossflow_bench_{uuid.uuid4().hex[:8]}"
            if admin:
                url = _database(admin, name, create=True)
            try:
                rows.append(run(args.study, args.trials, k, url, not args.no_tracking,
                                args.sampler))
            finally:
                if admin:
                    _database(admin, name, create=False)
            print(f"{label:<10} {k} workers: {rows[-1]}", file=sys.stderr, flush=True)
        result["runs"][label] = rows
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
