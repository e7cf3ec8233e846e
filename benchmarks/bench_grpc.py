"""Trials/s of K worker processes on PostgreSQL: Optuna's RDB storage directly, and through
Optuna's gRPC storage proxy (issue 20), in one run.

    eval "$(bash .ci/postgres.sh start)"        # a throwaway server (fsync=off)
    pip install grpcio protobuf                 # the proxy's own dependencies
    python benchmarks/bench_grpc.py [--trials 400] [--workers 1,4] [--study quickstart]
                                    [--postgres URL] [--repeat 2]

Each run creates a database, then K processes each run ``study.optimize`` on the study's
CrossFlow objective (TPE, the study's space) until the study has ``--trials`` finished
trials; with the proxy, one more process serves the RDB storage over gRPC
(``optuna.storages.run_grpc_proxy_server``) and the workers use ``GrpcStorageProxy``.  No
MLflow: the storage's own rate.  ``trials_per_s`` = trials / (last completion − first
start), from the storage.  Direct and proxied runs alternate, so load hits both alike.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import machine  # noqa: E402
from bench_workers import _database  # noqa: E402  (one throwaway database a run)

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(url: str, port: int) -> None:
    import optuna
    from optuna.storages import run_grpc_proxy_server

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    run_grpc_proxy_server(optuna.storages.RDBStorage(url), host="127.0.0.1", port=port)


def _storage(url: str | None, port: int | None):
    import optuna

    if port is not None:
        return optuna.storages.GrpcStorageProxy(host="127.0.0.1", port=port)
    return optuna.storages.RDBStorage(url)


def _work(study_name: str, spec: str, url: str | None, port: int | None, trials: int) -> None:
    import optuna
    from optuna.study import MaxTrialsCallback

    from crossflow.search.objective import Objective
    from crossflow.search.study import load_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    setup = load_study(spec)
    study = optuna.load_study(study_name=study_name, storage=_storage(url, port),
                              sampler=optuna.samplers.TPESampler(seed=os.getpid()))
    study.optimize(Objective(setup), callbacks=[MaxTrialsCallback(trials)],
                   catch=(Exception,))


def run(admin: str, spec: str, trials: int, workers: int, proxy: bool) -> dict:
    import optuna

    name = f"crossflow_grpc_{uuid.uuid4().hex[:8]}"
    url = _database(admin, name, create=True)
    server = None
    try:
        port = None
        if proxy:
            port = _free_port()
            server = mp.Process(target=_serve, args=(url, port), daemon=True)
            server.start()
        storage = _storage(url, None)     # creates the schema before anyone races for it
        optuna.create_study(study_name="bench", storage=storage)
        if proxy:
            deadline = time.monotonic() + 60
            while True:
                try:
                    optuna.load_study(study_name="bench", storage=_storage(None, port))
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        t0 = time.perf_counter()
        procs = [mp.Process(target=_work, args=("bench", spec, url, port, trials))
                 for _ in range(workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        wall = time.perf_counter() - t0
        done = [t for t in optuna.load_study(study_name="bench", storage=storage).trials
                if t.datetime_complete is not None]
        span = (max(t.datetime_complete for t in done)
                - min(t.datetime_start for t in done)).total_seconds()
        storage.remove_session()
        return {"workers": workers, "proxy": proxy, "trials": len(done),
                "trials_per_s": round(len(done) / span, 2), "wall_s": round(wall, 2)}
    finally:
        if server is not None:
            server.terminate()
            server.join()
        _database(admin, name, create=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--workers", default="1,4")
    ap.add_argument("--study", default="quickstart")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--postgres", default=os.environ.get("CROSSFLOW_TEST_POSTGRES"))
    args = ap.parse_args()
    if not args.postgres:
        ap.error("no PostgreSQL: give --postgres URL or run "
                 "eval \"$(bash .ci/postgres.sh start)\" first")
    mp.set_start_method("spawn")
    runs = []
    for _ in range(args.repeat):
        for k in (int(w) for w in args.workers.split(",")):
            for proxy in (False, True):
                r = run(args.postgres, args.study, args.trials, k, proxy)
                print(json.dumps(r), file=sys.stderr, flush=True)
                runs.append(r)
    summary = {}
    for k in (int(w) for w in args.workers.split(",")):
        for proxy in (False, True):
            rates = [r["trials_per_s"] for r in runs if r["workers"] == k and r["proxy"] == proxy]
            summary[f"{k} workers, {'gRPC proxy' if proxy else 'direct'}"] = {
                "median_trials_per_s": statistics.median(rates), "runs": rates}
    print(json.dumps({"machine": machine(), "study": args.study, "trials": args.trials,
                      "summary": summary, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
