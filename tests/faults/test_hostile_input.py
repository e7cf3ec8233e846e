"""A hostile user's inputs (issue 21) are refused quickly, in one paragraph, exit 2: YAML
that expands past any config's size, YAML 1.1 number forms, numbers too large to compute
with, sizes that would make one prediction unbounded, and odd arguments.  Each child process
runs under a time and address-space limit, so a regression fails instead of hanging."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crossflow.search.workers import child_env

#: Seconds and bytes one refused command may take (an answer takes ~1 s and ~200 MB).
LIMIT_S = 30
LIMIT_BYTES = 3 * 2**30


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def crossflow(*args: str, cwd: Path, timeout: float = LIMIT_S) -> tuple[int, str, str]:
    """``python -m crossflow ARGS`` in its own session under the limits; its whole group is
    killed past ``timeout`` (the test then fails on the exit status)."""
    proc = subprocess.Popen([sys.executable, "-m", "crossflow", *map(str, args)], cwd=cwd,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_limits)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -1, out, f"timed out after {timeout} s\n{err}"
    return proc.returncode, out, err


def refused(code: int, err: str, *said: str) -> None:
    assert code == 2, err
    assert err.startswith("crossflow: error: ") and "Traceback" not in err, err
    assert err.strip().count("\n") == 0, err
    for text in said:
        assert text in err, (text, err)


# --- 1. billion laughs ----------------------------------------------------------------------


def _laughs(kind: str) -> str:
    lines = [f"kind: {kind}", "lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("kind", ["gemm", "system", "study"])
def test_billion_laughs_is_refused_at_once(kind, tmp_path):
    (tmp_path / "lol.yaml").write_text(_laughs(kind))
    t0 = time.monotonic()
    code, _, err = crossflow("check", "lol.yaml", cwd=tmp_path)
    refused(code, err, "lol.yaml", "expands to more than 100,000 values")
    assert time.monotonic() - t0 < 15


def test_billion_laughs_in_a_study_run_is_refused(tmp_path):
    (tmp_path / "lol.yaml").write_text(_laughs("study"))
    code, _, err = crossflow("study", "run", "lol.yaml", "--no-tracking", "--quiet",
                             cwd=tmp_path)
    refused(code, err, "lol.yaml", "expands to more than")
    assert not list(tmp_path.glob("*.journal*")) and not (tmp_path / "mlruns").exists()


def test_an_alias_inside_itself_is_refused(tmp_path):
    (tmp_path / "self.yaml").write_text("kind: gemm\na: &x [1, *x]\n")
    code, _, err = crossflow("check", "self.yaml", cwd=tmp_path)
    refused(code, err, "self.yaml", "alias refers to a node that contains it")


def test_aliases_within_the_bound_still_work(tmp_path):
    from crossflow.config.base import read_yaml

    path = tmp_path / "aliases.yaml"
    path.write_text("base: &b {m: 64, n: 64}\ncopy: *b\nmore: [*b, *b]\n")
    data = read_yaml(path)
    assert data["copy"] == {"m": 64, "n": 64} and data["more"][1]["n"] == 64


# --- 4. YAML 1.2 numbers --------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("1:30", "1:30"), ("1_000", "1_000"), ("017", 17), ("0o17", 15), ("0x1F", 31),
    ("1e5", 1e5), ("-2.5", -2.5), ("+7", 7), ("inf", "inf"), ("0b101", "0b101"),
])
def test_numbers_follow_yaml_1_2_core(text, value, tmp_path):
    from crossflow.config.base import read_yaml

    (tmp_path / "n.yaml").write_text(f"x: {text}\n")
    got = read_yaml(tmp_path / "n.yaml")["x"]
    assert got == value and type(got) is type(value)


def test_sexagesimal_is_refused_where_a_number_is_wanted(tmp_path):
    (tmp_path / "g.yaml").write_text("kind: gemm\nm: 1:30\nn: 8\nk: 8\n")
    code, _, err = crossflow("check", "g.yaml", cwd=tmp_path)
    refused(code, err, "g.yaml", "key 'm' = '1:30'", "YAML 1.2")


# --- 5. numbers too large -------------------------------------------------------------------


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_huge_integer_is_refused_by_check_and_predict(digits, tmp_path):
    (tmp_path / "g.yaml").write_text(f"kind: gemm\nm: {'9' * digits}\nn: 8\nk: 8\n")
    code, _, err = crossflow("check", "g.yaml", cwd=tmp_path)
    refused(code, err, "g.yaml", "key 'm'", "too large", "1e+24")
    code, _, err = crossflow("predict", "--hardware", "a100-sxm4-80gb", "--workload",
                             "g.yaml", cwd=tmp_path)
    refused(code, err, "g.yaml", "key 'm'", "too large")


def test_the_bound_itself_is_a_valid_number(tmp_path):
    from crossflow.config.loader import load_spec
    from crossflow.errors import ConfigError

    (tmp_path / "g.yaml").write_text(f"kind: gemm\nm: {10**24}\nn: 8\nk: 1.0e24\n")
    with pytest.raises(ConfigError, match="valid integer"):  # not too large: k is an int
        load_spec(str(tmp_path / "g.yaml"))
    (tmp_path / "g.yaml").write_text(f"kind: gemm\nm: {10**24}\nn: 8\nk: 8\n")
    assert load_spec(str(tmp_path / "g.yaml")).m == 10**24


@pytest.mark.parametrize("text", ["1e400", "1e300", "-2e30"])
def test_a_huge_float_is_refused(text, tmp_path):
    from crossflow.config.loader import load_spec
    from crossflow.errors import ConfigError

    (tmp_path / "g.yaml").write_text(f"kind: gemm\nm: 8\nn: 8\nk: 8\nprecision: fp16\n"
                                     f"name: g\ncount: {text}\n")
    with pytest.raises(ConfigError, match="too large"):
        load_spec(str(tmp_path / "g.yaml"))


# --- 2. sizes that would make one prediction unbounded --------------------------------------


def _preset(family: str, name: str, tmp_path: Path, **values: object) -> str:
    """A copy of a shipped preset with top-level ``values`` changed."""
    from importlib import resources

    import yaml

    path = Path(str(resources.files("crossflow") / "presets" / family / f"{name}.yaml"))
    data = yaml.safe_load(path.read_text())
    data.update(values)
    out = tmp_path / f"{name}-changed.yaml"
    out.write_text(yaml.safe_dump(data))
    return out.name


def test_a_billion_devices_per_node_is_refused(tmp_path):
    system = _preset("systems", "dgx-a100", tmp_path, devices_per_node=10**9)
    code, _, err = crossflow("check", system, cwd=tmp_path)
    refused(code, err, system, "key 'devices_per_node' = 1000000000", "1,048,576")
    code, _, err = crossflow("predict", "--system", system, "--workload", "llama2-7b",
                             "--parallelism", "t8-p1-d1", cwd=tmp_path)
    refused(code, err, system, "devices_per_node")


def test_too_many_nodes_of_a_system_are_refused(tmp_path):
    system = _preset("systems", "dgx-a100", tmp_path, num_nodes=2**18)
    code, _, err = crossflow("check", system, cwd=tmp_path)
    refused(code, err, system, "key 'num_nodes'", "2,097,152 devices", "at most 131,072 nodes")


def test_a_strategy_of_too_many_devices_is_refused(tmp_path):
    workload = _preset("workloads", "llama2-7b", tmp_path, global_batch_size=2**22)
    code, _, err = crossflow("predict", "--system", "dgx-a100", "--workload", workload,
                             "--parallelism", "t8-p1-d262144", cwd=tmp_path)
    refused(code, err, "key 'parallelism'", "2,097,152 devices", "1,048,576")


def test_millions_of_micro_batches_are_refused_before_simulating(tmp_path):
    workload = _preset("workloads", "gpt3-175b", tmp_path, global_batch_size=96_000_000,
                       micro_batch_size=1)
    t0 = time.monotonic()
    code, _, err = crossflow("predict", "--system", "dgx-a100", "--workload", workload,
                             "--parallelism", "gpt3-175b-t8-p8-d24", cwd=tmp_path)
    refused(code, err, "key 'global_batch_size' = 96000000", "4,000,000 micro-batches",
            "at most 1,500,000")
    assert time.monotonic() - t0 < 15


def test_the_pipeline_simulator_counts_its_passes_first():
    from crossflow.errors import ConfigError
    from crossflow.sim.pipeline import MAX_PASSES, _check, simulate_pipeline

    m = MAX_PASSES // 16 + 1
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="at most 62,500 micro-batches per pipeline"):
        simulate_pipeline(stages=8, microbatches=m, fwd_s=[1.0] * 8, bwd_s=[1.0] * 8)
    assert time.monotonic() - t0 < 1
    _check("1f1b", 8, 1, m - 1, [1.0] * 8, [1.0] * 8)  # the limit itself is allowed


# --- 3. SIGTERM and SIGHUP to a single-process study run ------------------------------------


def _trials(journal: Path) -> dict[str, int]:
    from crossflow.search.study import load_study, open_study

    study = open_study(load_study("quickstart"), str(journal), create=False)
    states: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        states[t.state.name] = states.get(t.state.name, 0) + 1
    return states


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_stop_signal_ends_a_study_run_like_ctrl_c(sig, tmp_path):
    journal = tmp_path / "q.journal"
    proc = subprocess.Popen(
        [sys.executable, "-m", "crossflow", "study", "run", "quickstart", "--trials", "100000",
         "--storage", str(journal), "--no-tracking", "--quiet"],
        cwd=tmp_path, env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                journal.is_file() and _trials(journal).get("COMPLETE", 0) >= 3):
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert f"crossflow: {sig.name}: stopping after the trial in progress" in err, err
    assert "interrupted; run 'crossflow study run quickstart" in err and "Traceback" not in err
    states = _trials(journal)
    assert states.get("COMPLETE", 0) >= 3 and set(states) == {"COMPLETE"}, states
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".lock")]


# --- 5. --heartbeat out of range ------------------------------------------------------------


@pytest.mark.parametrize("beat", ["inf", "1e308", "nan", "0.5", "3601"])
def test_a_heartbeat_out_of_range_is_refused_before_the_storage(beat, tmp_path, monkeypatch,
                                                                 capsys):
    from crossflow.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["study", "run", "quickstart", "--trials", "2", "--storage",
                 "sqlite:///s.db", "--no-tracking", "--quiet", "--heartbeat", beat])
    err = capsys.readouterr().err
    refused(code, err, "--heartbeat", "from 1 to 3600 seconds")
    assert not list(tmp_path.iterdir())


# --- 6. a deleted working directory ---------------------------------------------------------

_IN_A_DELETED_FOLDER = """
import os, sys, tempfile
folder = tempfile.mkdtemp()
os.chdir(folder)
os.rmdir(folder)
from crossflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("argv", [
    ["study", "run", "quickstart", "--trials", "2", "--no-tracking", "--quiet"],
    ["check", "gemm-64k"],
], ids=["study-run", "check"])
def test_a_deleted_working_directory_is_said(argv, tmp_path):
    proc = subprocess.run([sys.executable, "-c", _IN_A_DELETED_FOLDER, *argv], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=LIMIT_S,
                          preexec_fn=_limits)
    refused(proc.returncode, proc.stderr, "working directory", "was it deleted?",
            "run crossflow from an existing directory")


# --- 7. duplicate names ---------------------------------------------------------------------


def test_two_memory_levels_of_one_name_are_refused(tmp_path):
    from importlib import resources

    import yaml

    preset = resources.files("crossflow") / "presets" / "hardware" / "a100-sxm4-80gb.yaml"
    data = yaml.safe_load(preset.read_text())
    data["memory"][2]["name"] = data["memory"][1]["name"]
    (tmp_path / "dup.yaml").write_text(yaml.safe_dump(data))
    code, _, err = crossflow("check", "dup.yaml", cwd=tmp_path)
    refused(code, err, "dup.yaml", "key 'memory[2].name' = 'L1'", "must be unique")


# --- 8. empty and contradictory options -----------------------------------------------------


@pytest.mark.parametrize(("argv", "said"), [
    (["calibrate", "cpu", "--quick", "--output", ""], ["--output", "an empty output"]),
    (["study", "run", "quickstart", "--trials", "2", "--tracking-uri", ""],
     ["--tracking-uri", "an empty tracking uri"]),
    (["study", "run", "quickstart", "--trials", "2", "--tracking-uri", "  "],
     ["--tracking-uri", "an empty tracking uri"]),
    (["study", "run", "quickstart", "--trials", "2", "--no-tracking", "--tracking-uri",
      "foo://x"], ["--tracking-uri", "'foo://x'", "contradict"]),
    (["compare", "quickstart", "--no-tracking", "--tracking-uri", "sqlite:///t.db"],
     ["--no-tracking and --tracking-uri contradict"]),
    (["study", "run", "quickstart", "--storage", ""], ["--storage", "an empty storage"]),
], ids=["calibrate-output", "tracking-empty", "tracking-blank", "no-tracking-with-uri",
        "compare-no-tracking-with-uri", "storage-empty"])
def test_empty_and_contradictory_options_are_refused(argv, said, tmp_path, monkeypatch,
                                                     capsys):
    from crossflow.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(argv)
    refused(code, capsys.readouterr().err, *said)
    assert not list(tmp_path.iterdir())  # nothing written, measured or created


@pytest.mark.parametrize("option", ["--storage", "--tracking-uri"])
def test_a_raw_at_in_a_password_is_refused_before_any_driver_sees_it(option, cli):
    """A driver would read 'pa@rd@host' as password 'pa' and host 'rd@host', and print the
    host (and so part of the password) in its error: refused first, the URL redacted."""
    url = "postgresql://bob:pa@rd@127.0.0.1:1/x"
    code, out, err = cli("study", "run", "quickstart", option, url, "--trials", "2",
                         *(("--no-tracking",) if option == "--storage" else ()))
    assert code == 2 and not out
    assert "raw '@'" in err and "%40" in err
    assert "pa@rd" not in err and "rd@" not in err


def test_a_step_that_does_not_divide_its_range_is_refused(tmp_path, cli):
    """Optuna would move 'high' to the last step with a raw UserWarning; the search-space
    file is refused instead, naming the step and where the range would end."""
    path = tmp_path / "space.yaml"
    path.write_text("kind: search_space\nname: s\nparams:\n  tdp_W: {low: 200, high: 400, "
                    "step: 75}\n")
    code, out, err = cli("check", str(path))
    assert code == 2 and not out
    assert "step" in err and "ends at 350" in err and "high: 350" in err
