"""``crossflow predict`` of a GEMM starts fast: a fresh process imports only what the
prediction uses (issue 20: the whole process took ~0.5 s, most of it imports of the
distributed model, networkx and the MLflow side the command never touches).  Figures:
``benchmarks/bench_startup.py``, docs/speed.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Modules a single-GEMM prediction does not use, each a measurable share of the start-up
#: (the distributed model and its graphs, the AGE and technology library, the search side).
NOT_FOR_A_GEMM = ("networkx", "crossflow.distributed", "crossflow.parallel",
                  "crossflow.workloads.transformer", "crossflow.arch.age",
                  "crossflow.tech.library", "crossflow.config.system", "crossflow.search.tracking",
                  "optuna", "mlflow", "matplotlib", "sqlalchemy",
                  "subprocess")  # (the install's git revision, asked only when recorded)

_RUN = """\
import json, sys, contextlib, io
from crossflow.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["predict", "--hardware", "a100-sxm4-80gb", "--workload", "gemm-8192",
                 "--json"])
print(json.dumps({"code": code, "out": out.getvalue(), "modules": sorted(sys.modules)}))
"""


def test_a_gemm_prediction_imports_nothing_it_does_not_use(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", _RUN], cwd=tmp_path, env=env, check=True,
                          capture_output=True, text=True, timeout=120)
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["code"] == 0 and json.loads(row["out"])["feasible"] is True
    loaded = set(row["modules"])
    assert not [m for m in NOT_FOR_A_GEMM if m in loaded]
