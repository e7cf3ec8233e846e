"""A strategy name carries the degrees outside the parallel grid as Megatron-LM's short
names: ``-c`` context, ``-e`` expert, ``-et`` expert-tensor parallelism."""

from __future__ import annotations

import pytest

from crossflow.errors import ConfigError
from crossflow.parallel.spec import parse_parallelism


@pytest.mark.parametrize("name, grid, cp, ep, etp", [
    ("t4-d4-sp-e8", "t4-d4-p1-sp", 1, 8, 1),
    ("t2-d4-sp-e4-et2", "t2-d4-p1-sp", 1, 4, 2),
    ("e8-t4-d4-sp", "t4-d4-p1-sp", 1, 8, 1),        # parts in any order, as the grid's
    ("t8-d16-p4-sp-c2", "t8-d16-p4-sp", 2, 1, 1),
    ("T8-D16-P4-C2", "t8-d16-p4", 2, 1, 1),
    ("CR-4-d2", "CR-4-d2-p1", 1, 1, 1),               # CR is a kernel type, not -c
])
def test_a_strategy_name_takes_context_and_expert_degrees(name, grid, cp, ep, etp):
    spec = parse_parallelism(name)
    assert str(spec.to_strategy()) == grid
    assert (spec.context_parallel, spec.expert_parallel, spec.expert_tensor_parallel) == (
        cp, ep, etp)


def test_a_bad_name_lists_the_options_it_could_have_had():
    with pytest.raises(ConfigError) as bad:
        parse_parallelism("t2-d8-x3")
    assert "-e{ep}" in bad.value.allowed and "-c{cp}" in bad.value.allowed
    with pytest.raises(ConfigError) as zero:
        parse_parallelism("t2-d8-e0")
    assert zero.value.key == "expert_parallel"
    with pytest.raises(ConfigError, match="given twice"):
        parse_parallelism("t2-d8-e8-e4")


def test_predict_names_the_expert_degree_it_ran(cli):
    code, out, _ = cli("predict", "--workload", "qwen3-30b-a3b", "--system",
                       "dgx-h100-megatron-core", "--parallelism", "t4-d4-sp-e8")
    assert code == 0, out
    assert "strategy      t4-d4-p1-sp-e8 on 16 devices" in out
    code, _, err = cli("predict", "--workload", "qwen3-30b-a3b", "--system",
                       "dgx-h100-megatron-core", "--parallelism", "t4-d4-sp-e32")
    assert code == 2 and "key 'expert_parallel' = 32" in err
