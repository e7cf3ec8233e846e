"""``crossflow presets [KIND]``: every shipped preset by kind, with its description."""

from __future__ import annotations

import json

import pytest

from crossflow.catalogue import KINDS, catalogue, describe
from crossflow.config.loader import preset_dir


def _on_disk() -> dict[str, set[str]]:
    out = {}
    for kind, family in KINDS.items():
        folder = preset_dir(family)
        if family == "measurements":
            out[kind] = {p.relative_to(folder).as_posix() for p in folder.rglob("*.csv")}
        else:
            out[kind] = {p.stem for p in folder.glob("*.yaml")}
    return out


def test_every_shipped_preset_is_listed_with_a_description(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./studies here: shipped presets only
    code, out, err = cli("presets", "--json")
    assert code == 0, err
    listed = json.loads(out)
    disk = _on_disk()
    assert {"hardware", "template", "technology", "workload", "system", "parallelism",
            "search-space", "study"} <= set(listed)
    assert {k: {e["name"] for e in v} for k, v in listed.items()} == disk
    for kind, entries in listed.items():
        for e in entries:
            assert e["origin"] == "shipped"
            assert e["description"] and "\n" not in e["description"], (kind, e["name"])
    # YAML 'description:' first, else the first sentence of the leading comment
    hw = {e["name"]: e["description"] for e in listed["hardware"]}
    assert hw["a100-sxm4-80gb"].startswith("NVIDIA A100 SXM4 80GB")
    par = {e["name"]: e["description"] for e in listed["parallelism"]}
    assert par["gemm-rc-4-2"].startswith("A distributed GEMM on 8 devices")
    # the text listing: one line per preset under a heading per kind
    code, out, _ = cli("presets")
    assert code == 0
    lines = out.splitlines()
    assert sum(1 for line in lines if line.startswith("  ")) == sum(map(len, disk.values()))
    for kind, names in disk.items():
        assert f"{kind} ({len(names)}):" in lines


@pytest.mark.parametrize("kind,family", [("workload", "workloads"), ("templates", "templates"),
                                         ("search space", "search_spaces"), ("tech", "tech")])
def test_a_kind_lists_that_kind_only(cli, kind, family):
    code, out, err = cli("presets", kind)
    assert code == 0, err
    names = sorted(p.stem for p in preset_dir(family).glob("*.yaml"))
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert rows == names
    assert len([line for line in out.splitlines() if line and not line.startswith(" ")]) == 1


def test_an_unknown_kind_is_exit_2_with_the_kinds(cli):
    code, out, err = cli("presets", "gpus")
    assert code == 2 and not out
    assert "unknown preset kind" in err and "'gpus'" in err
    for kind in KINDS:
        assert kind in err


def test_local_studies_are_listed_and_marked(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "mine.yaml").write_text(
        "# My own study.  Second sentence.\nkind: study\n")
    study = catalogue("study")["study"]
    mine = next(e for e in study if e["name"] == "mine")
    assert mine["origin"] == "local ./studies" and mine["description"] == "My own study"
    code, out, _ = cli("presets", "study")
    assert "mine" in out and "[local ./studies]" in out


def test_describe_reads_the_first_sentence_of_a_comment(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("#\n# Narayanan et al. SC21 Table 1, the 1.7B model.  More text.\n"
                 "# And more.\nkind: parallelism\n")
    assert describe(f) == "Narayanan et al. SC21 Table 1, the 1.7B model"
    f.write_text("kind: system\ndescription: >-\n  Two\n  lines\n# later comment\n")
    assert describe(f) == "Two lines"
