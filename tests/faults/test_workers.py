"""``study run --workers K``: no more processes than trials left (said so), a warning above
the CPU count, and the storage URL — a password in it — never on a worker's command line."""

from __future__ import annotations

import subprocess

from crossflow.search import workers
from crossflow.search.study import launch as launch_module
from crossflow.search.study import load_study, open_study


def test_workers_are_capped_at_the_trials_left(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch_module, "cpu_count", lambda: 1)
    started: list[int] = []
    real = workers.start_workers

    def counting(*args, **kwargs):
        procs = real(*args, **kwargs)
        started.append(len(procs))
        return procs

    monkeypatch.setattr(workers, "start_workers", counting)
    code, out, err = cli("study", "run", "quickstart", "--workers", "40", "--trials", "2",
                         "--no-tracking", "--quiet", "--storage", "q.journal")
    assert code == 0, err
    assert started == [2]
    assert "2 of 2 trials left: starting 2 worker processes, not 40" in err
    assert "2 worker processes on 1 CPUs" in err            # (cpu_count patched to 1)
    study = open_study(load_study("quickstart"), str(tmp_path / "q.journal"), create=False)
    launches = [v for k, v in study.user_attrs.items() if k.startswith("launch.")]
    assert [v["workers"] for v in launches] == [2]
    assert sum(t.state.name == "COMPLETE" for t in study.trials) == 2
    # one trial left: it runs in this process, no worker is started
    code, out, err = cli("study", "run", "quickstart", "--workers", "4", "--trials", "3",
                         "--no-tracking", "--quiet", "--storage", "q.journal")
    assert code == 0, err
    assert started == [2] and "starting 1 worker process, not 4" in err


def test_the_storage_url_is_not_on_a_workers_command_line(monkeypatch, tmp_path):
    url = "postgresql://alice:s3cret-pw@db.example:5432/studies"
    seen: list[tuple[list[str], dict[str, str]]] = []

    class Recorder:
        def __init__(self, cmd, **kwargs):
            seen.append((list(cmd), dict(kwargs["env"])))
            self.pid, self.returncode = 0, 0

    monkeypatch.setattr(subprocess, "Popen", Recorder)
    procs = workers.start_workers("quickstart", url, "launch.0000.x", 3, heartbeat_s=None)
    for w in procs:
        w.log.unlink()
    assert len(seen) == 3
    for argv, env in seen:
        assert not any("s3cret" in a for a in argv), argv
        assert "--storage" not in argv
        assert env[workers.STORAGE_ENV] == url


def test_a_worker_reads_its_storage_from_the_environment(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(workers.STORAGE_ENV, raising=False)
    code, _, err = cli("study", "worker", "quickstart")
    assert code == 2 and "--storage" in err and workers.STORAGE_ENV in err
    assert cli("study", "run", "quickstart", "--trials", "2", "--no-tracking", "--quiet",
               "--storage", "w.journal")[0] == 0
    monkeypatch.setenv(workers.STORAGE_ENV, str(tmp_path / "w.journal"))
    code, out, err = cli("study", "worker", "quickstart", "--no-tracking", "--quiet")
    assert code == 0, err
    assert "this worker ran 0 trials" in out          # the launch's 2 are done
