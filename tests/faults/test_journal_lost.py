"""The journal deleted under a running ``study run`` (issue 21, finding 14): the launch
stops with one paragraph naming the journal and what to do — no ``FileNotFoundError`` from
the tracking thread, no ``UnboundLocalError`` from Optuna's trial runner — exit 2, as for
the other storage faults of a journal (a full disk)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from crossflow.search.workers import child_env


@pytest.mark.parametrize("records", [30, 300])
def test_a_journal_deleted_mid_run_stops_the_launch_with_a_message(tmp_path, records):
    journal = tmp_path / "q.journal"
    proc = subprocess.Popen(
        [sys.executable, "-m", "crossflow", "study", "run", "quickstart", "--trials",
         "100000", "--quiet", "--storage", str(journal)], cwd=tmp_path, env=child_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and journal.read_bytes().count(b"\n") >= records:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        journal.unlink()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    assert err.startswith("crossflow: error: ") and err.strip().count("\n") == 0, err
    assert str(journal) in err and "deleted or moved away" in err, err
