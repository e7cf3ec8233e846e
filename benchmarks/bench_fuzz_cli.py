"""The long run of the command-line fuzz harness (issue 21; docs/reliability.md).

    python benchmarks/bench_fuzz_cli.py [--examples N] [--shrink]

Runs ``tests/faults/test_fuzz_cli.py`` with ``CROSSFLOW_FUZZ_EXAMPLES=N`` (default 300
examples per command and sub-command; CI runs 3), one pytest process, examples run one at a
time.  A failure is printed as hypothesis found it, without shrinking (each step is a
process) unless ``--shrink``.  Prints one JSON object: examples per command, the commands
that failed, wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import machine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=300, help="examples per command")
    ap.add_argument("--shrink", action="store_true", help="shrink a failure (slow)")
    opts = ap.parse_args()
    env = dict(os.environ, CROSSFLOW_FUZZ_EXAMPLES=str(opts.examples),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if opts.shrink:
        env["CROSSFLOW_FUZZ_SHRINK"] = "1"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/faults/test_fuzz_cli.py",
                           "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    sys.stderr.write(proc.stdout[-20000:])
    counts = {m[1]: int(m[2]) for m in re.finditer(
        r"test_hostile_arguments\[(.*?)\]:\n\s+- (\d+) passing", proc.stdout)}
    failed = re.findall(r"FAILED \S+\[(.*?)\]", proc.stdout)
    print(json.dumps({"machine": machine(), "examples_per_command": opts.examples,
                      "passing": counts, "total_passing": sum(counts.values()),
                      "failed": failed, "wall_s": round(wall, 1),
                      "pytest_exit": proc.returncode}, indent=2))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
