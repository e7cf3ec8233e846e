"""One transformer block measured on an H200 (plain torch) against the block's passes as a
training step prices them: the data set's tolerance, and the kernel breakdown that says
where the remaining error is (docs/validation.md, "One transformer block on a GPU")."""

from __future__ import annotations

import collections
import re

from crossflow.predict import load_hardware
from crossflow.validation import collect
from crossflow.validation.blocks import block_datasets, block_passes, moe_rows
from crossflow.validation.dataset import measurements_dir, read_preset_measurements


def _breakdown() -> dict[tuple[str, str, str], float]:
    """Seconds per (block, pass, gemm | attention | other) from the profiled kernels."""
    _, rows = read_preset_measurements(
        measurements_dir() / "gpu" / "torch_block_kernels_h200-sxm-141gb.csv")
    out: dict[tuple[str, str, str], float] = collections.defaultdict(float)
    for r in rows:
        kind = ("gemm" if re.search(r"nvjet|gemm|cutlass|xmma", r["kernel"], re.I) else
                "attention" if re.search(r"sdpa|fmha|cudnn|flash", r["kernel"], re.I) else
                "other")
        out[(r["block"], r["pass"], kind)] += float(r["us"]) * 1e-6
    return out


def test_the_dense_blocks_meet_their_tolerance():
    """The checked blocks and the held-out ones (other published shapes, measured after the
    model was built and priced without any change to it) are each a data set of their own
    within the same tolerance."""
    sets = {ds.name.rsplit("(", 1)[1].rstrip(")"): ds for ds in block_datasets()}
    dev, held = "torch_block_h200-sxm-141gb", "torch_block_heldout_h200-sxm-141gb"
    eager = ", PyTorch-eager passes"
    assert sorted(sets) == [dev, dev + eager, held, held + eager]
    assert len(sets[dev].rows) == 10 and len(sets[held].rows) == 16
    names = [d.name for d in collect("training")]
    for ds in sets.values():
        assert ds.passed, ds.render()
        assert ds.name in names


def test_pytorch_eager_passes_learnt_on_an_a100_narrow_the_h200_blocks_error():
    """The unfused rotary embedding and SiLU·mul of PyTorch eager, as fitted to Vidur's A100
    op times (vidur-a100-dgx: 2 passes each), move every Llama-style row toward its
    measurement on both files, leave the GPT-style rows as they were, and lower each file's
    MAPE by at least a point and a half (10.7 -> 8.6 %, held out 10.9 -> 8.6 %)."""
    sets = {ds.name: ds for ds in block_datasets()}
    for name, bare in sets.items():
        if name.endswith("passes)"):
            continue
        eager = sets[name[:-1] + ", PyTorch-eager passes)"]
        assert eager.mape <= bare.mape - 0.015, name
        for b, e in zip(bare.rows, eager.rows, strict=True):
            if b.label.startswith("gpt"):  # GPT-3 and GPT-2 blocks: no rotary, no SwiGLU
                assert e.predicted == b.predicted, b.label
            else:  # too fast on the bare preset, nearer with the passes
                assert b.error < e.error < 0.05, b.label
    # the MoE layer written as a loop over experts is recorded, not checked
    assert len(moe_rows()) == 4 and all(r.label.startswith("mixtral") for r in moe_rows())


def test_each_passs_gemms_and_attention_agree_with_the_profiled_kernels():
    """Kernel by kernel, the GEMMs of every dense block's pass are within 15 % of the
    profiled GEMM kernels, the attention core within 20 %, and the pass within 15 % of its
    kernels' sum (plain torch leaves the GPU idle between kernels for another 4-15 % of an
    eager pass, which no software profile prices here).  The other kernels of the
    GPT-3-style block (LayerNorm, GELU, adds, bias gradients) take 0.9-1.5 times the model's
    memory-bound passes; in the Llama-style blocks plain torch's unfused rotary embedding
    and SwiGLU take 1.3-3.5 times the fused passes the model prices, which is where their
    9-15 % lies."""
    kernels = _breakdown()
    preset, rows = read_preset_measurements(
        measurements_dir() / "gpu" / "torch_block_h200-sxm-141gb.csv")
    arch = load_hardware(preset)
    for r in rows:
        if r["experts"] != "0":
            continue
        forward, backward = block_passes(arch, r)
        for name, p in (("fwd", forward), ("bwd", backward)):
            gemm = kernels[(r["block"], name, "gemm")]
            assert abs((p.compute - p.attention) / gemm - 1) <= 0.15, (r["block"], name)
            attention = kernels[(r["block"], name, "attention")]
            assert abs(p.attention / attention - 1) <= 0.20, (r["block"], name)
            kernels_s = sum(kernels[(r["block"], name, kind)]
                            for kind in ("gemm", "attention", "other"))
            assert abs(p.total / kernels_s - 1) <= 0.15, (r["block"], name)
            other = kernels[(r["block"], name, "other")] / p.memory
            if r["rope"] == "1":
                assert 1.3 <= other <= 3.5, (r["block"], name, other)
            else:
                assert 0.8 <= other <= 1.6, (r["block"], name, other)
