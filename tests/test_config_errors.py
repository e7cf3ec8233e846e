"""Bad input gets one clear paragraph naming file, key path and value; exit status 2."""

from __future__ import annotations

import copy
import textwrap

import pytest
import yaml

from crossflow.config import load_spec
from crossflow.config.loader import preset_dir
from crossflow.errors import ConfigError

A100 = yaml.safe_load((preset_dir("hardware") / "a100-sxm4-80gb.yaml").read_text())
GEMM = {"kind": "gemm", "m": 1024, "k": 1024, "n": 1024, "precision": "fp16"}
MDS = yaml.safe_load((preset_dir("systems") / "dgx-a100-megatron-deepspeed.yaml").read_text())
VIDUR = yaml.safe_load((preset_dir("systems") / "vidur-a100-dgx.yaml").read_text())


def _edit(base: dict, path: str, value=..., delete: bool = False, rename: str | None = None):
    """Copy ``base`` and set / delete / rename the key at dotted ``path`` ([i] for lists)."""
    data = copy.deepcopy(base)
    parts = path.replace("[", ".").replace("]", "").split(".")
    node = data
    for p in parts[:-1]:
        node = node[int(p)] if p.isdigit() else node[p]
    last = parts[-1]
    if delete:
        del node[last]
    elif rename:
        node[rename] = node.pop(last)
    else:
        node[last] = value
    return data


# (id, file text or dict, text the message must contain)
CASES = [
    ("malformed-yaml", "kind: gemm\nm: [1, 2\n", "malformed YAML at line"),
    ("not-a-mapping", "- 1\n- 2\n", "must hold a YAML mapping"),
    ("empty-file", "", "must hold a YAML mapping"),
    ("duplicate-key", "kind: gemm\nm: 1\nm: 2\nk: 1\nn: 1\n", "duplicate key 'm'"),
    ("missing-kind", {"m": 1, "k": 1, "n": 1}, "key 'kind'"),
    ("unknown-kind", {**GEMM, "kind": "gemmm"}, "key 'kind' = 'gemmm'"),
    ("unknown-key", {**GEMM, "mm": 3}, "key 'mm' = 3: unknown key"),
    ("negative-size", {**GEMM, "m": -5}, "key 'm' = -5"),
    ("zero-size", {**GEMM, "n": 0}, "key 'n' = 0"),
    ("string-for-int", {**GEMM, "k": "big"}, "key 'k' = 'big'"),
    ("float-for-int", {**GEMM, "k": 1.5}, "key 'k' = 1.5"),
    ("unknown-precision", {**GEMM, "precision": "fp12"}, "key 'precision' = 'fp12'"),
    ("missing-dimension", {k: v for k, v in GEMM.items() if k != "m"}, "required key 'm'"),
    ("hw-unknown-nested-key", _edit(A100, "compute.cores", 5), "key 'compute.cores' = 5"),
    ("hw-wrong-unit-dimension", _edit(A100, "compute.frequency_GHz", rename="frequency_GBps"),
     "key 'compute.frequency_GBps'"),
    ("hw-missing-unit", _edit(A100, "compute.frequency_GHz", rename="frequency"),
     "key 'compute.frequency'"),
    ("hw-negative-capacity", _edit(A100, "memory[1].capacity_KiB", -1),
     "key 'memory[1].capacity_KiB' = -1"),
    ("hw-fraction-over-one", _edit(A100, "compute.efficiency", 1.5),
     "key 'compute.efficiency' = 1.5"),
    ("hw-unknown-scope", _edit(A100, "memory[0].scope", "warp"), "key 'memory[0].scope' = 'warp'"),
    ("hw-scopes-out-of-order", _edit(A100, "memory[0].scope", "global"), "innermost"),
    ("hw-unknown-precision-peak", _edit(A100, "compute.peak_TFLOPS.int4", 10),
     "compute.peak_TFLOPS.int4"),
    ("hw-bool-for-number", _edit(A100, "compute.num_bundles", True),
     "key 'compute.num_bundles' = True"),
    ("hw-missing-section", _edit(A100, "memory", delete=True), "required key 'memory'"),
    ("hw-string-quantity", _edit(A100, "memory[3].capacity_GiB", "80 GB"),
     "key 'memory[3].capacity_GiB' = '80 GB': must be a number in GiB"),
    ("hw-unknown-link-kind", _edit(A100, "links.pcie", {"count": 1}), "links.pcie"),
    ("hw-unknown-dataflow", _edit(A100, "compute.dataflow", "rs"), "key 'compute.dataflow' = 'rs'"),
    ("hw-empty-loop-orders", _edit(A100, "memory[1].loop_orders", []),
     "memory[1].loop_orders"),
    ("hw-both-units", _edit(A100, "compute.frequency_MHz", 1410), "given twice"),
    ("sw-unknown-sync", _edit(MDS, "software.sync", "always"),
     "key 'software.sync' = 'always'"),
    ("sw-negative-dispatch", _edit(MDS, "software.dispatch_us", -3),
     "key 'software.dispatch_us' = -3"),
    ("sw-dispatch-without-unit", _edit(MDS, "software.dispatch_us", rename="dispatch"),
     "key 'software.dispatch'"),
    ("sw-passes-below-one", _edit(VIDUR, "software.memory_passes.layernorm", 0.5),
     "key 'software.memory_passes.layernorm' = 0.5"),
    ("sw-unknown-pass-op", _edit(VIDUR, "software.memory_passes.rmsnorm", 2),
     "software.memory_passes.rmsnorm"),
    ("ll-fraction-over-one", _edit(VIDUR, "intra.collective.low_latency.efficiency", 1.5),
     "key 'intra.collective.low_latency.efficiency' = 1.5"),
    ("ll-missing-latency", _edit(VIDUR, "intra.collective.low_latency.step_latency_us",
                                 delete=True), "intra.collective.low_latency"),
]


@pytest.mark.parametrize(("case", "content", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_file_is_rejected_with_the_key_named(tmp_path, cli, case, content, expected):
    path = tmp_path / f"{case}.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    before = sorted(tmp_path.iterdir())
    code, out, err = cli("check", path)
    assert code == 2
    assert str(path) in err, err
    assert expected in err, err
    assert "Traceback" not in err
    # one paragraph per error (a link with three keys missing has three)
    assert all(line.startswith(f"crossflow: error: {path}: ")
               for line in err.strip().splitlines()), err
    assert sorted(tmp_path.iterdir()) == before, "nothing written"


def test_there_are_at_least_twenty_distinct_bad_inputs():
    assert len({c[0] for c in CASES}) >= 20


def test_unknown_preset_lists_the_presets(cli):
    code, _, err = cli("predict", "--hardware", "a100", "--workload", "gemm")
    assert code == 2
    assert "unknown hardware" in err and "a100-sxm4-80gb" in err


def test_unknown_option_is_exit_2(cli):
    code, _, err = cli("predict", "--hardwar", "x")
    assert code == 2 and "command line" in err


def test_debug_shows_the_traceback(tmp_path):
    from crossflow.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**GEMM, "m": 0}))
    with pytest.raises(ConfigError):
        main(["--debug", "check", str(path)])


def test_errors_quote_the_value_as_written_not_in_si():
    data = _edit(A100, "compute.frequency_GHz", -1.41)
    with pytest.raises(ConfigError) as info:
        load_spec(data, "hardware")
    assert "compute.frequency_GHz' = -1.41" in str(info.value)


def test_check_accepts_good_files(tmp_path, cli):
    path = tmp_path / "ok.yaml"
    path.write_text(textwrap.dedent("""\
        kind: gemm
        m: 64
        k: 128
        n: 256
        precision: bf16
    """))
    code, out, _ = cli("check", path)
    assert code == 0 and "ok (gemm)" in out


@pytest.mark.parametrize("content, key", [
    ("tensor_parallel: 3\ndata_parallel: 5\n", "'tensor_parallel' = 3"),  # heads: 32
    ("pipeline_parallel: 5\n", "'pipeline_parallel' = 5"),                # layers: 32
    ("context_parallel: 3\ndata_parallel: 1\n", "'context_parallel' = 3"),
    ("data_parallel: 8\nexpert_parallel: 2\n", "'expert_parallel' = 2"),  # a dense model
])
def test_a_degree_that_does_not_fit_the_workload_names_the_parallelism_file(
        tmp_path, cli, content, key):
    """The degrees are checked against the workload after both files are read; the error
    still names the file the degree is in, not "command line"."""
    path = tmp_path / "par.yaml"
    path.write_text(content)
    code, out, err = cli("predict", "--workload", "llama3-8b", "--system",
                         "dgx-h100-megatron-core", "--parallelism", path)
    assert code == 2 and out == ""
    assert err.startswith(f"crossflow: error: {path}: key {key}:"), err
    assert "command line" not in err and len(err.strip().splitlines()) == 1


def test_a_misspelt_key_or_preset_gets_a_suggestion(tmp_path, cli):
    path = tmp_path / "par.yaml"
    path.write_text("kind: parallelism\ntensor_paralel: 8\n")
    code, _, err = cli("check", path)
    assert code == 2 and "(did you mean 'tensor_parallel'?)" in err
    code, _, err = cli("predict", "--workload", "lama3-8b", "--system", "dgx-h100")
    assert code == 2 and "unknown workload preset 'lama3-8b'" in err
    assert "(did you mean 'llama3-8b'?)" in err
    path.write_text("kind: gemm\nm: 64\nk: 64\nn: 64\nflavour: 1\n")  # nothing close
    code, _, err = cli("check", path)
    assert code == 2 and "unknown key 'flavour'" in err and "did you mean" not in err
