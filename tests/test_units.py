import re

import pytest

from crossflow import units


def test_decimal_and_binary_prefixes_are_distinct():
    assert units.GB == 1e9
    assert units.GiB == 2**30
    assert units.to_si(80, "GiB") == 80 * 2**30
    assert units.to_si(2039, "GBps") == 2.039e12
    assert units.to_si(200, "Gbps") == 25e9  # bits, not bytes


@pytest.mark.parametrize(
    ("key", "canonical"),
    [
        ("bandwidth_GBps", "bandwidth_Bps"),
        ("capacity_KiB", "capacity_B"),
        ("latency_us", "latency_s"),
        ("frequency_GHz", "frequency_Hz"),
        ("energy_pJ_per_bit", "energy_J_per_bit"),
        ("area_mm2", "area_mm2"),
        ("peak_TFLOPS", "peak_FLOPS"),
        ("power_W", "power_W"),
    ],
)
def test_canonical_keys(key, canonical):
    assert units.canonical_key(key) == canonical


def test_unit_suffix_is_split_longest_first():
    assert units.split_unit("dram_energy_pJ_per_bit") == ("dram_energy", "pJ_per_bit")
    assert units.split_unit("name") is None
    assert units.split_unit("GB") is None  # a bare unit is not a key with a unit


def test_conversions_are_exact_enough():
    assert units.to_si(1.41, "GHz") == pytest.approx(1.41e9, rel=1e-15)
    assert units.to_si(5, "us") == pytest.approx(5e-6)
    assert units.to_si(4.5, "pJ_per_bit") == pytest.approx(4.5e-12)


def test_human_formatting():
    assert units.fmt_time(0.0038) == "3.8 ms"
    assert units.fmt_bytes(80e9) == "80 GB"
    assert units.fmt_rate(312e12) == "312 TFLOP/s"


def test_numbers_side_by_side_never_switch_to_exponents():
    """'349 GB beside 2.1e+03 GB' read as two different kinds of number (issue 20)."""
    assert units.fmt_plain(2095.3) == "2095" and units.fmt_plain(349.2) == "349"
    assert units.fmt_plain(4.834) == "4.83" and units.fmt_plain(0.2049) == "0.205"
    assert units.fmt_gb(2.0953e12) == "2095 GB" and units.fmt_gb(4.83e9) == "4.83 GB"
    assert units.fmt_time(1234.5) == "1234 s" and units.fmt_time(0.0) == "0 s"
    assert units.fmt_energy(3.689e6) == "3.69 MJ" and units.fmt_energy(0.814) == "814 mJ"


def test_an_infeasible_memory_reason_names_every_term_in_gb(cli):
    code, out, _ = cli("predict", "--workload", "gpt3-175b", "--system", "dgx-a100",
                       "--parallelism", "t1-d1536-p1")
    assert code == 3
    reason = out.split("INFEASIBLE: ", 1)[1].splitlines()[0]  # the options that fit follow
    terms = reason.split("(", 1)[1].rstrip(")").split(", ")
    assert len(terms) == 4 and all(re.fullmatch(r"[a-z ]+ \d+(\.\d+)? GB", t) for t in terms), out
    assert "optimizer state 2095 GB" in reason and "e+" not in reason
