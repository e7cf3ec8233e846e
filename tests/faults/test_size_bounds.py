"""Inputs that would make one prediction unbounded in time or memory are answered quickly:
a long LSTM's memory is known without unrolling it, and an unroll past the simulator's
bound is refused up front."""

from __future__ import annotations

import time

import pytest
import yaml

import crossflow
from crossflow.config.loader import load_spec
from crossflow.distributed import _memory_breakdown, _strategy
from crossflow.errors import ConfigError
from crossflow.sim.graph_sim import graph_memory
from crossflow.workloads import compute_graph
from crossflow.workloads.lstm import MAX_KERNELS, lstm_kernels

LSTM = load_spec("lstm-paper-case-study", "workloads")
CASE = {"hardware": "deepflow-case-study", "system": "deepflow-case-study-512"}


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("steps", [1, 7, 20])
def test_kernel_count_without_building_the_graph(layers, steps):
    spec = LSTM.model_copy(update={"seq_length": steps, "num_layers": layers})
    assert lstm_kernels(spec) == compute_graph(spec).number_of_nodes()


@pytest.mark.parametrize("strategy", ["lstm-rc-4-2-d32-p2", "RC-16-8-d4-p1", "RC-64-4-d1-p2",
                                      "CR-64-d8-p1"])
@pytest.mark.parametrize("steps", [33, 200, 1000])
def test_long_sequence_memory_equals_the_full_graph(strategy, steps):
    spec = LSTM.model_copy(update={"seq_length": steps})
    spec, st, par = _strategy(spec, strategy)
    full = graph_memory(compute_graph(spec), st)
    _, fast = _memory_breakdown(spec, st, par)
    assert fast.keys() == full.keys()
    for key in full:
        assert fast[key] == pytest.approx(full[key], rel=1e-12, abs=1e-6), key


def test_a_long_infeasible_lstm_answers_in_a_second():
    spec = LSTM.model_copy(update={"seq_length": 20_000})
    t0 = time.perf_counter()
    p = crossflow.predict(workload=spec, parallelism="lstm-rc-4-2-d32-p2", **CASE)
    assert time.perf_counter() - t0 < 5.0  # was 65 s and 1.4 GB
    assert not p.feasible and "exceeds" in p.reason
    assert p.memory_per_device_bytes > 1e12


def test_an_unroll_past_the_bound_is_refused_with_the_longest_allowed():
    # a batch small enough to fit: the memory check passes, the unroll is too long
    spec = LSTM.model_copy(update={"seq_length": 20_000, "global_batch_size": 1024,
                                   "hidden_size": 1024, "vocab_size": 32_000})
    assert lstm_kernels(spec) > MAX_KERNELS
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="seq_length") as err:
        crossflow.predict(workload=spec, parallelism="RC-4-2-d64-p1", **CASE)
    assert time.perf_counter() - t0 < 5.0
    longest = int(str(err.value).split("seq_length <= ")[1].split()[0])
    assert lstm_kernels(spec.model_copy(update={"seq_length": longest})) <= MAX_KERNELS
    assert lstm_kernels(spec.model_copy(update={"seq_length": longest + 1})) > MAX_KERNELS


def test_too_many_layers_for_any_unroll_names_the_layers_and_check_says_so_too(tmp_path, cli):
    """100 000 layers do not fit even at seq_length 1: the message names num_layers and the
    deepest that fits (it used to say 'seq_length <= -1'); ``check`` refuses the file as
    ``predict`` does."""
    spec = LSTM.model_copy(update={"num_layers": 100_000})
    with pytest.raises(ConfigError, match="num_layers") as err:
        crossflow.predict(workload=spec, parallelism="lstm-rc-4-2-d32-p2", **CASE)
    deepest = int(str(err.value).split("num_layers <= ")[1].split()[0])
    assert lstm_kernels(spec.model_copy(update={"num_layers": deepest})) <= MAX_KERNELS
    assert lstm_kernels(spec.model_copy(update={"num_layers": deepest + 1})) > MAX_KERNELS
    path = tmp_path / "deep.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    code, out, err_text = cli("check", str(path))
    assert code == 2 and not out and "key 'num_layers' = 100000" in err_text
