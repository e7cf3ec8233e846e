"""Time one transformer block's forward and backward pass on a GPU, written in plain torch.

    python measure_torch_block.py --preset h200-sxm-141gb [--output FILE] [--repeat 20]
        [--set dev|heldout] [--profile]

Each block is the Megatron-LM layout of a decoder layer, in bf16, on one GPU: a pre-norm
(LayerNorm or RMSNorm), the QKV projection (queries plus one key and one value per query
group), rotary embeddings on q and k where the model has them, causal fused attention
(``scaled_dot_product_attention`` on the cuDNN backend, grouped-query attention through
``enable_gqa``), the output projection and a residual add; a second pre-norm, the MLP (GELU,
or SwiGLU: one GEMM to the gate and up projections, SiLU(gate)·up, the down projection) and a
residual add.  The blocks are GPT-3-style and Llama-3-style layers at sizes of today's runs,
the slice of a Llama-3 70B layer that one rank of eight-way tensor parallelism computes
(its GEMMs and attention, without the collectives), and a Mixtral-8x7B-style mixture-of-experts
layer: a router GEMM, top-k over its logits (softmax over the k kept), the token copies sorted
by expert, each expert's SwiGLU MLP on its tokens one expert after another, and the copies
weighted and added back — once with each expert's GEMMs one after another (``loop``: what a
dropless MoE layer does without grouped kernels, with a host synchronisation for the token
counts), once with every expert's GEMM in one grouped GEMM (``grouped``: ``torch._grouped_mm``,
as Megatron-Core's grouped-GEMM experts run, no synchronisation).

Per block: ``fwd_s``, the median of ``--repeat`` CUDA-event-timed forward calls, and
``bwd_s``, the median of as many backward calls of one retained graph (input, weight and
bias gradients; each parameter's gradient reset to None before each call, so gradients are
written, not accumulated), each after 3 warm-up calls.  The header names the hardware preset
the rows validate (``# preset: NAME``).  Written to a temporary file and renamed, so an
interrupted run leaves nothing half-written.

``--profile`` writes instead, per block and pass, every GPU kernel's time per call from
torch's profiler (``torch_block_kernels_<preset>.csv``): where a block's time goes.

``--set heldout`` times the blocks of :data:`HELD_OUT` instead — other published shapes,
measured after the model had been compared with the rows above, a check nothing was fitted
to (``torch_block_heldout_<preset>.csv``, ``torch_block_kernels_heldout_<preset>.csv``).

``--device cpu --tiny`` runs every block at a small size on the CPU to check the script
(nothing is written).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import _record

#: name: (micro-batch, sequence, hidden, heads, query groups, head dim, MLP width, gated
#: (SwiGLU), RMSNorm, rotary, biases, experts, top-k; 0 experts: a dense MLP).  Widths from
#: each model's published configuration (GPT-3 5B: NeMo GPTConfig5B; Llama 3 8B / 70B:
#: Megatron-Bridge Llama3ModelProvider; Mixtral 8x7B: NeMo MixtralConfig8x7B).
BLOCKS = {
    "gpt3-5b": (4, 2048, 4096, 32, 32, 128, 16384, False, False, False, True, 0, 0),
    "llama3-8b": (1, 8192, 4096, 32, 8, 128, 14336, True, True, True, False, 0, 0),
    "llama3-8b-b2-s4096": (2, 4096, 4096, 32, 8, 128, 14336, True, True, True, False, 0, 0),
    "llama3-70b": (1, 4096, 8192, 64, 8, 128, 28672, True, True, True, False, 0, 0),
    "llama3-70b-tp8-rank": (1, 8192, 8192, 8, 1, 128, 3584, True, True, True, False, 0, 0),
    "mixtral-8x7b": (1, 4096, 4096, 32, 8, 128, 14336, True, True, True, False, 8, 2),
    "mixtral-8x7b-grouped": (1, 4096, 4096, 32, 8, 128, 14336, True, True, True, False, 8, 2),
}
#: Blocks written down before the model priced them (``--set heldout``): other published
#: shapes — a head dimension of 64, 96 and 256, attention wider than the hidden size, GPT-2
#: and GPT-3-style small blocks, tensor-parallel ranks of Llama-3 8B and 405B — a check of
#: the dense rows above that nothing was fitted to.  Widths from each model's published
#: configuration (Hugging Face config.json of Qwen2.5-7B, Mistral-NeMo-12B, Gemma-2-9B,
#: Phi-3-mini, GPT-2 XL; GPT-3 1.3B: Brown et al. 2020, table 2.1; Llama 3: Megatron-Bridge
#: Llama3ModelProvider), with SwiGLU / GELU as the block above writes them and no biases
#: but GPT's.
HELD_OUT = {
    "qwen2.5-7b": (1, 4096, 3584, 28, 4, 128, 18944, True, True, True, False, 0, 0),
    "mistral-nemo-12b": (1, 4096, 5120, 32, 8, 128, 14336, True, True, True, False, 0, 0),
    "gemma2-9b-d256": (1, 4096, 3584, 16, 8, 256, 14336, True, True, True, False, 0, 0),
    "phi3-mini-d96": (2, 4096, 3072, 32, 32, 96, 8192, True, True, True, False, 0, 0),
    "gpt2-xl": (8, 1024, 1600, 25, 25, 64, 6400, False, False, False, True, 0, 0),
    "gpt3-1.3b": (8, 2048, 2048, 16, 16, 128, 8192, False, False, False, True, 0, 0),
    "llama3-8b-tp2-rank": (1, 8192, 4096, 16, 4, 128, 7168, True, True, True, False, 0, 0),
    "llama3-405b-tp8-rank": (1, 8192, 16384, 16, 1, 128, 6656, True, True, True, False, 0, 0),
}
#: ``--set`` name -> (blocks, the file-name part after ``torch_block``).
SETS = {"dev": (BLOCKS, ""), "heldout": (HELD_OUT, "_heldout")}
#: The blocks whose experts run as grouped GEMMs (the other MoE blocks: a loop over experts).
GROUPED = {"mixtral-8x7b-grouped"}
COLUMNS = ("block,micro_batch,seq,hidden,heads,query_groups,head_dim,ffn,gated,rmsnorm,rope,"
           "bias,experts,topk,expert_kernels,backend,dtype,fwd_s,bwd_s")


def build(torch, shape, device: str, dtype, grouped: bool = False):
    """The block as a callable x -> y, and its parameters (``grouped``: the experts' GEMMs
    as grouped GEMMs)."""
    import torch.nn.functional as F
    from torch import nn

    b, s, h, heads, groups, d, ffn, gated, rms, rope, bias, experts, topk = shape
    norm = (lambda: nn.RMSNorm(h, eps=1e-5)) if rms else (lambda: nn.LayerNorm(h, eps=1e-5))
    # grouped: one (experts, out, in) tensor per weight, given to the grouped GEMM transposed
    # (its second operand column-major, as torch._grouped_mm takes it)
    def weights(rows: int, cols: int) -> nn.ParameterList:
        if grouped:
            return nn.ParameterList([nn.Parameter(torch.randn(experts, cols, rows) * rows ** -0.5)])
        return nn.ParameterList(nn.Parameter(torch.randn(rows, cols) * rows ** -0.5)
                                for _ in range(experts))

    mlp = ({"router": nn.Linear(h, experts, bias=False),
            "w1": weights(h, 2 * ffn), "w2": weights(ffn, h)} if experts else
           {"fc1": nn.Linear(h, ffn * (2 if gated else 1), bias=bias),
            "fc2": nn.Linear(ffn, h, bias=bias)})
    mods = nn.ModuleDict({
        "norm1": norm(), "qkv": nn.Linear(h, (heads + 2 * groups) * d, bias=bias),
        "proj": nn.Linear(heads * d, h, bias=bias), "norm2": norm(), **mlp,
    }).to(device=device, dtype=dtype)
    if rope:
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=device).float() / d))
        angles = torch.outer(torch.arange(s, device=device).float(), inv)
        cos = torch.cat([angles.cos()] * 2, -1).to(dtype)
        sin = torch.cat([angles.sin()] * 2, -1).to(dtype)

    def rotary(t):
        half = t.shape[-1] // 2
        return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

    def moe(y):
        tokens = y.reshape(-1, h)
        weight, expert = torch.topk(mods["router"](tokens), topk, dim=-1)
        weight = weight.float().softmax(-1).to(dtype).reshape(-1, 1)
        slot = expert.reshape(-1).argsort()
        counts = torch.bincount(expert.reshape(-1), minlength=experts)
        routed = tokens.index_select(0, slot // topk)
        if grouped:
            ends = counts.cumsum(0).to(torch.int32)
            gate, up = torch._grouped_mm(routed, mods["w1"][0].transpose(-2, -1),
                                         offs=ends).chunk(2, -1)
            routed = torch._grouped_mm(F.silu(gate) * up, mods["w2"][0].transpose(-2, -1),
                                       offs=ends)
        else:
            outs = []
            for e, chunk in enumerate(routed.split(counts.tolist())):
                gate, up = (chunk @ mods["w1"][e]).chunk(2, -1)
                outs.append((F.silu(gate) * up) @ mods["w2"][e])
            routed = torch.cat(outs)
        routed = routed * weight.index_select(0, slot)
        return torch.zeros_like(tokens).index_add(0, slot // topk, routed).view_as(y)

    def block(x):
        y = mods["qkv"](mods["norm1"](x))
        q, k, v = y.split([heads * d, groups * d, groups * d], -1)
        q = q.view(b, s, heads, d).transpose(1, 2)
        k = k.view(b, s, groups, d).transpose(1, 2)
        v = v.view(b, s, groups, d).transpose(1, 2)
        if rope:
            q, k = rotary(q), rotary(k)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=groups != heads)
        x = x + mods["proj"](o.transpose(1, 2).reshape(b, s, heads * d))
        if experts:
            return x + moe(mods["norm2"](x))
        u = mods["fc1"](mods["norm2"](x))
        if gated:
            gate, up = u.chunk(2, -1)
            u = F.silu(gate) * up
        else:
            u = F.gelu(u, approximate="tanh")
        return x + mods["fc2"](u)

    return block, list(mods.parameters())


def passes(torch, shape, device: str, grouped: bool = False):
    """``{"fwd": call, "bwd": call}`` of one block: its forward on one input, and the backward
    of one retained graph to the input, weight and bias gradients."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    block, params = build(torch, shape, device, dtype, grouped)
    b, s, h = shape[:3]
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    y = block(x)
    grad = torch.randn_like(y)
    return {"fwd": lambda: block(x),
            "bwd": lambda: torch.autograd.grad(y, [x, *params], grad, retain_graph=True)}


def measure(torch, shape, device: str, repeat: int,
            grouped: bool = False) -> tuple[float, float]:
    """Median forward and backward seconds of one block."""
    calls = passes(torch, shape, device, grouped)
    if device != "cuda":  # a check of the script: one call each, plain wall clock
        out = []
        for call in calls.values():
            t0 = time.perf_counter()
            call()
            out.append(time.perf_counter() - t0)
        return out[0], out[1]
    fwd, bwd = (statistics.median(_record.timings(torch, call, repeat))
                for call in calls.values())
    return fwd, bwd


def profile(torch, name: str, shape, calls: int = 5, device: str = "cuda",
            grouped: bool = False) -> list[str]:
    """Rows ``block,pass,kernel,launches,us``: each GPU kernel's launches and microseconds
    per call of the pass, summed over ``calls`` profiled calls after 3 warm-up calls (on the
    CPU, each op's self time: a check of the script)."""
    gpu = device == "cuda"
    rows = []
    for pass_, call in passes(torch, shape, device, grouped).items():
        for e in _record.profiled(torch, call, calls, gpu):
            us = e.self_device_time_total if gpu else e.self_cpu_time_total
            if us > 0:
                kernel = e.key.replace(",", ";").replace("\n", " ")[:200]
                rows.append(f"{name},{pass_},\"{kernel}\",{e.count / calls:g},{us / calls:.2f}")
    return rows


def main() -> int:
    parser = _record.arguments(__doc__, "torch_block")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="small sizes (a check of the script)")
    parser.add_argument("--profile", action="store_true",
                        help="each kernel's time per pass from torch's profiler instead")
    parser.add_argument("--set", default="dev", choices=tuple(SETS),
                        help="the blocks: dev (the checked rows) or heldout (HELD_OUT)")
    args = parser.parse_args()
    blocks, part = SETS[args.set]

    import torch

    if args.device == "cuda" and _record.no_cuda(torch):
        return 2
    if args.profile:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        rows = []
        for name, shape in blocks.items():
            try:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    rows += profile(torch, name, shape, grouped=name in GROUPED)
            except RuntimeError as exc:
                print(f"{name}: not profiled ({str(exc)[:300]})", file=sys.stderr)
            torch.cuda.empty_cache()
        out = Path(args.output or Path(__file__).with_name(
            f"torch_block_kernels{part}_{args.preset}.csv"))
        header = _record.header(torch, __file__, "torch.profiler, CUDA activity: each kernel's "
                                "self device time summed over 5 calls of the pass after 3 "
                                "warm-up calls, per call", args.preset, cudnn=True)
        _record.write_csv(out, header, "block,pass,kernel,launches,us", rows)
        return 0
    rows = []
    for name, shape in blocks.items():
        if args.tiny:  # 1/16 of the widths, 1/32 of the sequence, the same structure
            b, s, h, heads, groups, d, ffn, *flags = shape
            shape = (b, s // 32, h // 16, max(heads // 8, 1), max(groups // 8, 1), d // 4,
                     ffn // 16, *flags)
        backend = "cpu"
        if args.device == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            # cuDNN's fused attention, what Transformer Engine runs on Hopper; FlashAttention-2
            # where cuDNN refuses the shape (said so on stderr and in the row)
            for backend, kernel in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                    ("flash", SDPBackend.FLASH_ATTENTION)):
                try:
                    with sdpa_kernel(kernel):
                        fwd, bwd = measure(torch, shape, "cuda", args.repeat,
                                           name in GROUPED)
                    break
                except RuntimeError as exc:
                    print(f"{name}: {backend} attention failed ({exc}); next backend",
                          file=sys.stderr)
            else:
                continue
            torch.cuda.empty_cache()
        elif name in GROUPED:  # torch._grouped_mm runs on Hopper GPUs only
            continue
        else:
            fwd, bwd = measure(torch, shape, "cpu", 1)
        b, s, h, heads, groups, d, ffn, gated, rms, rope, bias, experts, topk = shape
        kernels = "none" if not experts else "grouped" if name in GROUPED else "loop"
        rows.append(f"{name},{b},{s},{h},{heads},{groups},{d},{ffn},{int(gated)},{int(rms)},"
                    f"{int(rope)},{int(bias)},{experts},{topk},{kernels},{backend},bf16,"
                    f"{fwd:.9g},{bwd:.9g}")
        print(rows[-1], flush=True)
    if args.device != "cuda":
        return 0
    out = Path(args.output or Path(__file__).with_name(f"torch_block{part}_{args.preset}.csv"))
    header = _record.header(torch, __file__, f"median of {args.repeat} CUDA-event-timed calls "
                            "after 3 warm-up calls, forward and backward separately; attention "
                            "on the cuDNN backend", args.preset, cudnn=True)
    _record.write_csv(out, header, COLUMNS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
