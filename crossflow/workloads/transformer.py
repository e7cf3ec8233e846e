"""GPT-style transformer in the Megatron-LM layout, one micro-batch per pass of the graph.

Per block (Narayanan et al. SC21, arXiv:2104.04473 §3; Korthikanti et al. 2022,
arXiv:2205.05198 §4), with b = micro-batch, s = sequence, h = hidden, a = heads, f = ffn,
T = b·s tokens::

    ln1 ─ qkv ─ qk ─ softmax ─ attn_dropout ─ av ─ proj ─ proj_residual ─ ln2 ─ mlp1 ─ gelu
        ─ mlp2 ─ mlp_residual

``qkv`` (T, h)×(h, 3h); ``qk`` b·a × (s, h/a)×(h/a, s); ``softmax`` over (b·a·s, s) — Megatron's
fused scale-mask-softmax kernel; ``attn_dropout`` on the probabilities; ``av`` b·a ×
(s, s)×(s, h/a); ``proj`` (T, h)×(h, h); ``*_residual`` the fused bias-dropout-add;
``mlp1`` (T, h)×(h, f) with the fused bias-GeLU; ``mlp2`` (T, f)×(f, h).

**Attention is modelled unfused**, as Megatron ran it in 2021/2022: two batched GEMMs with
the s×s scores and probabilities written to memory between them, and a fused softmax kernel
(not FlashAttention).

Before the blocks: word-embedding lookup (``emb.lookup``) and the position-embedding add with
dropout (``emb.add_dropout``); after them: ``final_ln``, the vocabulary projection ``logits``
(T, h)×(h, V) with the word embedding's weights (tied) and ``cross_entropy`` (a row-wise
softmax over V, Megatron's vocab-parallel cross entropy).

Backward: every GEMM gets ``.dX`` (input gradient) and ``.dW`` (weight gradient), each as
many FLOPs as the forward GEMM; the attention GEMMs get the gradients of both operands
(``qk.dQ``/``qk.dK``, ``av.dP``/``av.dV``).  Element-wise backward nodes read the gradient and
the saved tensor; the layernorm backward fuses the residual-gradient add.  Bias gradients
are counted in ``wgrad_elements`` but not as separate kernels.

Recomputation (``activation_recompute``): ``selective`` recomputes the ``recompute_modules``
(Megatron-Core's; by default the attention core, whose activations are large but cheap: QKᵀ,
softmax, dropout, Korthikanti §5) just before their backward; ``full`` checkpoints each
block's input and recomputes the whole block forward before its backward (SC21's
"activation recomputation").  Recomputed nodes have phase
``recompute`` and ids ending in ``.re``.

An optimizer node per unit (Adam with fp32 master weights, states and gradients: reads
param, grad, m, v and writes param, m, v) runs once per iteration.

A hybrid stack (``hybrid_override_pattern``) builds each layer from one part: the
attention half (``ln1`` … ``proj_residual``), the MLP or MoE half (``ln2`` …
``mlp_residual``, its residual the layer's input), or a Mamba-2 mixer (:data:`MAMBA_OPS`,
its norm and residual named as attention's).

One file of over 600 lines on purpose: the block's forward, its backward and the MoE
layer's and the Mamba-2 mixer's nodes are one graph whose node names, stash edges and
recompute copies refer to each other; split across files, those names would have to be
kept in step by hand.
"""

from __future__ import annotations

from functools import lru_cache

import networkx as nx

from crossflow.arch.microarch import BYTES_PER_ELEMENT
from crossflow.config.attention_window import window_layers
from crossflow.config.workload import TransformerSpec
from crossflow.errors import ConfigError
from crossflow.kernels.ops import NO_WINDOW
from crossflow.workloads.graph import GraphBuilder

#: forward nodes of a block, in order (the defaults: GPT-3's block, unfused attention)
BLOCK_OPS: tuple[str, ...] = (
    "ln1", "qkv", "qk", "softmax", "attn_dropout", "av", "proj", "proj_residual",
    "ln2", "mlp1", "gelu", "mlp2", "mlp_residual",
)
#: what selective recomputation recomputes (the attention core, Korthikanti §5); with a
#: flash kernel Megatron-Core checkpoints the fused core attention (``core_attn``)
SELECTIVE_OPS: tuple[str, ...] = ("qk", "softmax", "attn_dropout")
FLASH_SELECTIVE_OPS: tuple[str, ...] = ("attn",)
#: the GEMMs Transformer Engine runs in FP8 when the workload's precision is fp8 (its Linear
#: layers; the attention core and the output layer stay bf16)
FP8_GEMMS: tuple[str, ...] = ("qkv", "proj", "mlp1", "mlp2")
#: multi-head latent attention's projections in place of ``qkv`` (Megatron-Core's
#: MLASelfAttention; DeepSeek-V2, arXiv:2405.04434 §2.1): the query down-projection to
#: q_lora_rank and its norm, the query up-projection to heads × (qk_head_dim +
#: qk_pos_emb_head_dim); the key / value down-projection to kv_lora_rank plus the shared
#: rotary key, its norm, the up-projection to heads × (qk_head_dim + v_head_dim).  Without a
#: q_lora_rank one ``q_proj`` from the hidden state replaces the first three
MLA_OPS: tuple[str, ...] = ("q_down", "q_ln", "q_up", "kv_down", "kv_ln", "kv_up")
MLA_OPS_NO_Q_LORA: tuple[str, ...] = ("q_proj", "kv_down", "kv_ln", "kv_up")
#: an MoE layer's routing, before the experts: the router GEMM (h × experts), its softmax
#: and top-k, the load-balancing loss, and the permutation of the tokens into expert order
MOE_ROUTER_OPS: tuple[str, ...] = ("router", "router_topk", "aux_loss", "permute")
#: latent MoE (``moe_latent_size``): Megatron-Core's ``fc1_latent_proj`` takes each token
#: down to the latent width before the permutation, ``fc2_latent_proj`` back up after the
#: un-permutation; both replicated over tensor parallelism, like the router
MOE_LATENT_OPS: tuple[str, str] = ("latent_down", "latent_up")
#: the grouped expert GEMMs (one kernel for a rank's experts; ``count`` experts, each with
#: its share of the routed tokens): the simulator re-shards them over expert parallelism.
#: Their ``expert_tokens`` names the dimension holding the tokens, ``expert_width`` the one
#: expert tensor parallelism splits (fc1's output width, fc2's input width, and the same
#: weight dimension in their gradients); ``expert_gathered`` marks the FP8 casts of the
#: full-width rows the expert-tensor group gathers (fc1's input, fc2's output gradient)
EXPERT_GEMMS: tuple[str, ...] = ("expert_fc1", "expert_fc2")
#: a Mamba-2 mixer (Megatron-Core's MambaMixer; Dao and Gu, "Transformers are SSMs",
#: ICML 2024, §6-7): the input projection to z, x, B, C and dt; the causal depthwise
#: convolution of x, B and C (width 4) with SiLU; the chunked scan (SSD) as its matrix
#: products — within each chunk of 128 tokens a masked "attention" of C·Bᵀ over x
#: (``ssd_chunk``), across chunks the states Bᵀ·x and their outputs C·state
#: (``ssd_state``); the gated RMSNorm y · SiLU(z); the output projection (``out_proj``,
#: after ``out_cast`` under FP8)
MAMBA_OPS: tuple[str, ...] = ("in_proj", "conv1d", "ssd_chunk", "ssd_state", "mamba_norm",
                              "out_proj")
#: Megatron-Core's MambaMixer: d_conv 4 (its default) and chunk_size 128 (the SSD kernels'
#: chunk); the convolution costs 2 FLOPs per tap, its bias and SiLU; the gated RMSNorm its
#: square, sum, scale, weight and the SiLU gate
MAMBA_CONV_WIDTH, MAMBA_CHUNK = 4, 128
MAMBA_CONV_FLOPS = 2.0 * MAMBA_CONV_WIDTH + 1 + 4
MAMBA_NORM_FLOPS = 5.0 + 4
#: the load-balancing loss per (token, expert) probability (Switch Transformer's
#: fraction × probability sum, Megatron's switch_load_balancing_loss_func)
AUX_LOSS_FLOPS = 4.0
#: Adam: FLOPs per parameter (moments, bias correction, sqrt, divide, update, weight decay)
ADAM_FLOPS_PER_PARAM = 12.0
#: GeLU (tanh form) and dropout arithmetic per element; SiLU(gate)·up; rotary (2 mul, 1 add
#: per element and the sin/cos); FP8 cast (amax, scale, convert)
GELU_FLOPS = 8.0
SWIGLU_FLOPS = 6.0
ROPE_FLOPS = 3.0
CAST_FLOPS = 2.0
DROPOUT_FLOPS = 2.0
#: Transformer Engine's quantization of a bf16 GEMM input, per precision: (reads of the
#: bf16 tensor, quantized copies a forward cast writes).  FP8: one cast kernel, one copy (a
#: gradient's cast-transpose writes two, :meth:`_Block._dy_cast`), fused into the layernorm
#: for the norm-fed GEMMs.  NVFP4: the per-tensor amax first (its global scale, taken after
#: the Hadamard rotation for the column-wise copy: ``nvte_hadamard_transform_amax``), then
#: one kernel writing the row-wise copy and the rotated column-wise one the weight gradient
#: reads — for inputs and gradients alike, and not fused into the layernorm
#: (TransformerEngine@d0067d0: pytorch/csrc/quantizer.cpp, NVFP4Quantizer::quantize_impl;
#: pytorch/csrc/extensions/normalization.cpp, layernorm_fwd)
QUANTIZE: dict[str, tuple[int, int]] = {"fp8": (1, 1), "fp4": (2, 2)}


def block_ops(spec: TransformerSpec, kind: str | bool = "*-") -> tuple[str, ...]:
    """The forward nodes of one block of ``spec``, in order.  ``kind`` is what the layer
    holds (:attr:`TransformerSpec.layer_kinds`): ``*-`` attention and an MLP, ``*E``
    attention and an MoE layer, or one layer of a hybrid stack (``M``, ``*``, ``-``, ``E``);
    ``True`` / ``False`` are ``*E`` / ``*-``."""
    kind = {True: "*E", False: "*-"}.get(kind, kind)
    quantized = spec.quantized
    if "M" in kind:  # a Mamba-2 mixer (MAMBA_OPS), its norm and residual named as attention's
        return (("ln1",) + MAMBA_OPS[:-1] + (("out_cast",) if quantized else ())
                + ("out_proj", "proj_residual"))
    mixer: tuple[str, ...] = ()
    if "*" in kind:
        attention = (("attn",) if attention_backend(spec) == "flash"
                     else ("qk", "softmax") + (("attn_dropout",) if spec.attention_dropout
                                              else ()) + ("av",))
        if spec.multi_latent_attention:  # its decoupled rotary part is always there
            qkv = (MLA_OPS if spec.q_lora_rank else MLA_OPS_NO_Q_LORA) + ("rope",)
        else:
            qkv = (("qkv",) + (("qk_ln",) if spec.qk_norm_width else ())
                   + (("rope",) if spec.position_embedding_type == "rope" else ()))
        mixer = (("ln1",) + qkv + attention + (("proj_cast",) if quantized else ())
                 + ("proj", "proj_residual"))
    if "E" in kind:
        down, up = ((op,) if spec.moe_latent_size else () for op in MOE_LATENT_OPS)
        mlp = (MOE_ROUTER_OPS[:-1] + down + MOE_ROUTER_OPS[-1:]
               + (("expert_cast",) if quantized else ())
               + ("expert_fc1", "expert_act", "expert_fc2", "unpermute") + up
               + (("shared_fc1", "shared_act", "shared_fc2") if spec.shared_ffn else ()))
    elif "-" in kind:
        mlp = ("mlp1", "swiglu" if spec.gated_linear_unit else "gelu", "mlp2")
    else:
        return mixer
    return mixer + ("ln2",) + mlp + ("mlp_residual",)


def attention_backend(spec: TransformerSpec) -> str:
    """The attention kernel the graph uses: the workload's, else unfused."""
    backend = spec.attention_backend or "unfused"
    if backend == "unfused" and spec.fp8_dot_product_attention:
        raise ConfigError(
            "runs the attention core in FP8, which only a fused kernel does (Transformer "
            "Engine's FP8 attention), and here it is unfused: the workload sets no "
            "attention_backend, and the system's software profile (software.attention), or "
            "without a system the default, runs it unfused",
            key="fp8_dot_product_attention", value=True,
            allowed="false, or attention_backend: flash")
    return backend


def transformer_graph(spec: TransformerSpec, *, micro_batch_size: int | None = None
                      ) -> nx.DiGraph:
    """The compute graph of one micro-batch (``micro_batch_size`` overrides the spec's)."""
    b = micro_batch_size or spec.micro_batch_size
    if spec.global_batch_size % b:
        raise ConfigError(f"must divide the workload's global_batch_size "
                          f"({spec.global_batch_size})", key="micro_batch_size", value=b)
    return _build(spec, b)


def block_params(spec: TransformerSpec) -> int:
    """Parameters of one dense block: QKV, projection and MLP weights (with biases under
    ``add_bias_linear``), two norms (12h² + 13h for GPT-3's block: LayerNorm, biases)."""
    h, f, f_in = spec.hidden_size, spec.ffn, spec.mlp_in_width
    return _attention_params(spec) + h * f_in + f * h + spec.linear_bias * (f_in + h)


def _attention_params(spec: TransformerSpec) -> int:
    h, qkv, q = spec.hidden_size, spec.qkv_width, spec.q_width
    if spec.multi_latent_attention:  # no biases (DeepSeek-V3's linear layers have none)
        a, ql = spec.num_attention_heads, spec.q_lora_rank
        kvl, nope, rope, v = spec.mla_dims
        query = (h * ql + ql + ql * a * (nope + rope)) if ql else h * a * (nope + rope)
        return (query + h * (kvl + rope) + kvl + kvl * a * (nope + v) + q * h
                + 2 * spec.norm_params)
    return (h * qkv + q * h + spec.linear_bias * (qkv + h) + 2 * spec.norm_params
            + spec.qk_norm_params)


def moe_block_params(spec: TransformerSpec) -> tuple[int, int]:
    """(parameters every rank of a tensor-parallel group shares the usual way, the routed
    experts' parameters) of one MoE block.  The first: attention, layernorms, the router
    (h × experts), a latent MoE's two h × latent projections and the shared expert; the
    second, which expert parallelism divides: each expert's two (three when gated)
    width × moe_ffn weights (width: :attr:`~TransformerSpec.moe_width`), without biases
    (Megatron-Core's MoE models are built with ``add_bias_linear=False``)."""
    h, E, w = spec.hidden_size, spec.num_moe_experts, spec.moe_width
    gated = 2 if spec.gated_linear_unit else 1
    shared = (gated + 1) * h * spec.shared_ffn
    latent = 2 * h * w if spec.moe_latent_size else 0
    return (_attention_params(spec) + h * E + latent + shared,
            E * (w * spec.moe_in_width + spec.moe_ffn * w))


def mamba_params(spec: TransformerSpec) -> int:
    """Parameters of one Mamba-2 layer: its norm, the input projection (no bias), the
    convolution's weights and biases, dt's bias, A and D per head, the gated norm's weight
    and the output projection (no bias)."""
    h, di, heads = spec.hidden_size, spec.mamba_inner, spec.mamba_heads
    return (spec.norm_params + h * spec.mamba_in_width
            + (MAMBA_CONV_WIDTH + 1) * spec.mamba_conv_width
            + 3 * heads + di + di * h)


def layer_params(spec: TransformerSpec, layer: int) -> tuple[int, int]:
    """(non-expert, expert) parameters of layer ``layer`` (from 0)."""
    return kind_params(spec, spec.layer_kinds[layer])


def kind_params(spec: TransformerSpec, kind: str) -> tuple[int, int]:
    """(non-expert, expert) parameters of a layer of one kind (a symbol of
    :attr:`~TransformerSpec.layer_kinds`: a hybrid stack's layer, or a block of attention
    and an MLP, ``*-``, or an MoE layer, ``*E``)."""
    if spec.hybrid_override_pattern is not None:
        return _hybrid_layer_params(spec, kind)
    return moe_block_params(spec) if kind == "*E" else (block_params(spec), 0)


def mtp_params(spec: TransformerSpec) -> tuple[int, int]:
    """(non-expert, expert) parameters of the multi-token-prediction block: per depth (one
    depth's when ``mtp_use_repeated_layer``) its layers, its three norms and the 2h × h
    projection; the embedding and output head are the model's."""
    h = spec.hidden_size
    dense = expert = 0
    for kind in spec.mtp_layer_kinds:
        d, e = kind_params(spec, kind)
        dense, expert = dense + d, expert + e
    depths = 1 if spec.mtp_use_repeated_layer else spec.mtp_num_layers
    return (depths * (dense + 3 * h + 2 * h * h) if spec.mtp_num_layers else 0,
            depths * expert)


def _hybrid_layer_params(spec: TransformerSpec, kind: str) -> tuple[int, int]:
    """A hybrid stack's layer of one symbol: its own sublayer and one norm (the block
    counts of attention + MLP hold two norms)."""
    norm = spec.norm_params
    if kind == "M":
        return mamba_params(spec), 0
    if kind == "*":
        return _attention_params(spec) - norm, 0
    if kind == "-":
        return block_params(spec) - _attention_params(spec) + norm, 0
    shared, experts = moe_block_params(spec)
    return shared - _attention_params(spec) + norm, experts


class _Block:
    """Builds one block's forward, recomputation and backward into a GraphBuilder."""

    def __init__(self, g: GraphBuilder, spec: TransformerSpec, b: int, layer: int) -> None:
        self.g, self.spec, self.layer = g, spec, layer
        self.s, self.h, self.a, self.f = (spec.seq_length, spec.hidden_size,
                                          spec.num_attention_heads, spec.ffn)
        self.d, self.q, self.qkv_n, self.f_in = (spec.head_dim, spec.q_width,
                                                 spec.qkv_width, spec.mlp_in_width)
        self.b, self.t = b, b * spec.seq_length
        self.bytes = BYTES_PER_ELEMENT[spec.activation_precision]
        self.gemm_precision = spec.precision
        self.quantized = spec.quantized  # the Linear GEMMs read casts of their inputs
        #: the flash kernel's format: FP8 under fp8_dot_product_attention (q, k, v and the
        #: output in FP8, products at the FP8 rate), else the activations'
        self.attn_precision = "fp8" if spec.fp8_dot_product_attention else None
        #: a cast reads bf16 and writes the GEMM's format (QUANTIZE): its reads counted in
        #: elements of that format (2 for FP8, 2 · 2 / 0.5625 for NVFP4)
        reads, self.cast_writes = QUANTIZE.get(spec.precision, (0, 0))
        self.cast_reads = reads * self.bytes / BYTES_PER_ELEMENT[spec.precision]
        self.cast = f"{spec.precision}_cast"
        self.norm_cast = spec.precision == "fp4"  # no layernorm kernel writes NVFP4
        self.causal = int(spec.causal)
        #: the flash kernel's sliding window in this layer (an unfused core computes every
        #: score and masks them: the window saves it nothing)
        self.window = spec.window_size if window_layers(spec)[layer] else NO_WINDOW
        self.kind = spec.layer_kinds[layer]
        self.moe = "E" in self.kind
        #: whether the block has a mixer (attention or Mamba-2) before its feed-forward
        #: part; without one (a hybrid stack's MLP or MoE layer) that part's residual is
        #: the block's input
        self.mixer = "*" in self.kind or "M" in self.kind
        self.ops = block_ops(spec, self.kind)
        if "M" in self.kind:
            #: the SSD scan's chunks of all heads, and the in-chunk products' width (the
            #: mean of C·Bᵀ's per head, groups·state / heads, and the head width)
            self.ssd_chunks = b * spec.mamba_heads * -(-spec.seq_length // MAMBA_CHUNK)
            self.ssd_width = (spec.mamba_num_groups * spec.mamba_state_dim // spec.mamba_heads
                              + spec.mamba_head_dim) // 2
        self.mla = spec.multi_latent_attention
        self.recomputed = spec.recomputed_modules
        #: the op whose output the attention reads, and the queries' / keys' width per head
        self.qkv_op = "kv_up" if self.mla else "qkv"
        self.dqk = spec.qk_dim
        # a flash kernel's forward (QKᵀ, PV) and backward (QKᵀ, dV, dP, dQ, dK) products
        # priced at one width: with MLA's wider queries and keys, the FLOP-weighted mean
        self.d_fwd = (self.dqk + self.d) / 2 if self.mla else self.d
        self.d_bwd = (3 * self.dqk + 2 * self.d) / 5 if self.mla else self.d
        self.prefix = f"L{layer}."
        #: a norm's weights (2h for LayerNorm) and whether the linear layers have biases
        self.norm, self.bias = spec.norm_params, spec.linear_bias
        #: the unfused core's probabilities as the AV product reads them (after dropout, or
        #: the softmax's own output without it); a residual add's FLOPs (with its dropout)
        self.probs = "attn_dropout" if spec.attention_dropout else "softmax"
        self.residual_flops = (DROPOUT_FLOPS if spec.hidden_dropout else 0.0) + 1
        self.src: dict[str, str] = {}  # op -> node holding its (latest) forward output

    def forward(self, x: str, phase: str, ops: tuple[str, ...] | None = None) -> str:
        """Forward nodes of ``ops``; returns the block output node."""
        g, t, h, s, a, f, b = self.g, self.t, self.h, self.s, self.a, self.f, self.b
        d, q, qkv_n, f_in = self.d, self.q, self.qkv_n, self.f_in
        ops = ops or self.ops
        gp = {"precision": self.gemm_precision}
        bias = self.bias
        suffix = "" if phase == "fwd" else ".re"
        own = phase == "fwd"
        g.context = {"phase": phase, "layer": self.layer, "unit": self.layer + 1}
        p = self.prefix
        new: dict[str, str] = {}

        def node(op: str) -> str:
            return p + op + suffix

        def get(op: str) -> str:
            return new.get(op) or self.src[op]

        def qk_in() -> str:  # what the rotary embedding reads: q and k, normalised or not
            return get("qk_ln") if "qk_ln" in self.ops else get("qkv")

        def qkv_out() -> str:  # rotary embedding rewrites q and k in place
            return get("rope") if "rope" in self.ops else qk_in()

        act = "act"

        def ffn_input() -> str:  # what the feed-forward part adds its residual to
            return get("proj_residual") if self.mixer else x

        for op in ops:
            n = node(op)
            if op == "ln1":
                g.rowwise(n, "layernorm", op, t, h, sp="rows", params=self.norm * own)
                g.edge(x, n, act if own else "stash")
                n = self._norm_cast(n, node("ln1_cast"))
            elif op == "qkv":
                g.gemm(n, op, t, h, qkv_n, tp="n", params=(h * qkv_n + bias * qkv_n) * own,
                       **gp)
                g.edge(get("ln1"), n, act)
            elif op == "qk_ln":
                # one norm kernel each for the queries and the keys, over rows of one head's
                # width (Megatron-Core's TENorm of head_dim)
                g.rowwise(n, "layernorm", op, t * self.spec.qk_norm_width // d, d, tp="rows",
                          params=self.spec.qk_norm_params * own)
                g.edge(get("qkv"), n, act)
            elif op == "rope":
                if self.mla:  # each head's rotary query part and the one shared rotary key
                    rope = self.spec.mla_dims[2]
                    g.elementwise(n, op, t * (a + 1) * rope, flops_per_element=ROPE_FLOPS,
                                  tp="elements")
                    g.edge(get("q_up" if "q_up" in self.ops else "q_proj"), n, act)
                    g.edge(get("kv_up"), n, act)
                else:
                    # q and k: (heads + query groups) · head_dim per token
                    g.elementwise(n, op, t * (q + self.spec.query_groups * d),
                                  flops_per_element=ROPE_FLOPS, tp="elements")
                    g.edge(qk_in(), n, act)
            elif op == "attn":
                g.attention(n, op, b * a, s, self.d_fwd, gemms=2, causal=self.causal,
                            window=self.window, tp="heads", precision=self.attn_precision)
                g.edge(qkv_out(), n, "act" if self.qkv_op in new else "stash",
                       t * qkv_n * self.bytes)
            elif op == "qk":
                g.gemm(n, op, s, self.dqk, s, count=b * a, batch="count", tp="count")
                g.edge(qkv_out(), n, "act" if self.qkv_op in new else "stash",
                       2 * t * a * self.dqk * self.bytes)
            elif op == "softmax":
                g.rowwise(n, "softmax", op, b * a * s, s, tp="rows")
                g.edge(get("qk"), n, act)
            elif op == "attn_dropout":
                g.elementwise(n, op, b * a * s * s, flops_per_element=DROPOUT_FLOPS,
                              tp="elements")
                g.edge(get("softmax"), n, act)
            elif op == "av":
                g.gemm(n, op, s, s, d, count=b * a, batch="count", tp="count")
                g.edge(get(self.probs), n, act)
                g.edge(qkv_out(), n, act, t * q * self.bytes)
            elif op == "proj_cast":
                self._quantize(n, t * q, get("attn" if "attn" in self.ops else "av"),
                               tp="elements")
            elif op == "proj":
                g.gemm(n, op, t, q, h, tp="k", params=(q * h + bias * h) * own, **gp)
                g.edge(get("proj_cast" if self.quantized else
                           ("attn" if "attn" in self.ops else "av")), n, act)
            elif op == "proj_residual":
                g.elementwise(n, op, t * h, inputs=2, flops_per_element=self.residual_flops,
                              sp="elements")
                g.edge(get("out_proj" if "M" in self.kind else "proj"), n, act)
                g.edge(x, n, act if own else "stash")
            elif op == "ln2":
                g.rowwise(n, "layernorm", op, t, h, sp="rows", params=self.norm * own)
                g.edge(ffn_input(), n, act)
                if not self.moe:  # an MoE layer's router reads it in bf16
                    n = self._norm_cast(n, node("ln2_cast"))
            elif op == "mlp1":
                g.gemm(n, op, t, h, f_in, tp="n", params=(h * f_in + bias * f_in) * own, **gp)
                g.edge(get("ln2"), n, act)
            elif op == "gelu":
                g.elementwise(n, op, t * f, flops_per_element=GELU_FLOPS, tp="elements")
                g.edge(get("mlp1"), n, act)
            elif op == "swiglu":
                g.elementwise(n, op, t * f, inputs=2, flops_per_element=SWIGLU_FLOPS,
                              tp="elements")
                g.edge(get("mlp1"), n, act)
            elif op == "mlp2":
                g.gemm(n, op, t, f, h, tp="k", params=(f * h + bias * h) * own, **gp)
                g.edge(get("swiglu" if self.spec.gated_linear_unit else "gelu"), n, act)
            elif op in MLA_OPS or op in MLA_OPS_NO_Q_LORA:
                self._mla_node(op, n, get, gp, own)
            elif op in MAMBA_OPS or op == "out_cast":
                self._mamba_node(op, n, get, gp, own)
            elif op == "mlp_residual":
                g.elementwise(n, op, t * h, inputs=2, flops_per_element=self.residual_flops,
                              sp="elements")
                if self.moe:
                    g.edge(get("latent_up" if self.spec.moe_latent_size else "unpermute"),
                           n, act)
                    if "shared_fc2" in self.ops:
                        g.edge(get("shared_fc2"), n, act)
                else:
                    g.edge(get("mlp2"), n, act)
                g.edge(ffn_input(), n, act)
            else:
                self._moe_forward(op, n, get, gp, own)
            new[op] = n
        self.src.update(new)
        return new.get("mlp_residual") or new.get("proj_residual", "")

    def _mamba_node(self, op: str, n: str, get, gp: dict, own: bool) -> None:
        """One node of a Mamba-2 mixer (:data:`MAMBA_OPS`).  Tensor parallelism splits its
        heads and groups as Megatron-Core's MambaMixer does: the input projection is
        column-parallel, the output projection row-parallel, the convolution, the scan and
        the norm run on a rank's heads."""
        g, t, h, spec = self.g, self.t, self.h, self.spec
        di, heads, P = spec.mamba_inner, spec.mamba_heads, spec.mamba_head_dim
        N, cw, chunks = spec.mamba_state_dim, spec.mamba_conv_width, self.ssd_chunks
        act, nb = "act", self.bytes
        if op == "in_proj":
            width = spec.mamba_in_width
            g.gemm(n, op, t, h, width, tp="n", params=h * width * own, **gp)
            g.edge(get("ln1"), n, act)
        elif op == "conv1d":
            g.elementwise(n, op, t * cw, flops_per_element=MAMBA_CONV_FLOPS, tp="elements",
                          params=(MAMBA_CONV_WIDTH + 1) * cw * own)
            g.edge(get("in_proj"), n, act, t * cw * nb)
        elif op == "ssd_chunk":
            # within a chunk: (C·Bᵀ masked) · x per head, priced as a causal flash kernel of
            # the chunk's length at the products' mean width (C·Bᵀ is per group)
            g.attention(n, op, chunks, MAMBA_CHUNK, self.ssd_width, gemms=2, causal=1,
                        tp="heads")
            g.edge(get("conv1d"), n, act)
            g.edge(get("in_proj"), n, act, t * heads * nb)  # dt
        elif op == "ssd_state":
            # across chunks: each chunk's state Bᵀ·x (state × head width) and its output
            # C·state, one batched kernel each: priced as one GEMM with the chunks and heads
            # stacked (a kernel of count small GEMMs is one launch, not count)
            g.gemm(n, op, 2 * chunks * N, MAMBA_CHUNK, P, tp="m")
            g.edge(get("conv1d"), n, act)
        elif op == "mamba_norm":
            g.elementwise(n, op, t * di, inputs=2, flops_per_element=MAMBA_NORM_FLOPS,
                          tp="elements", params=(di + 3 * heads) * own)
            g.edge(get("ssd_chunk"), n, act)
            g.edge(get("ssd_state"), n, act, t * di * nb)
            g.edge(get("in_proj"), n, act, t * di * nb)  # z
        elif op == "out_cast":
            self._quantize(n, t * di, get("mamba_norm"), tp="elements")
        elif op == "out_proj":
            g.gemm(n, op, t, di, h, tp="k", params=di * h * own, **gp)
            g.edge(get("out_cast" if self.quantized else "mamba_norm"), n, act)
        else:
            raise ValueError(f"unknown block op {op!r}")

    def _mla_node(self, op: str, n: str, get, gp: dict, own: bool) -> None:
        """One projection of multi-head latent attention (:data:`MLA_OPS`).  The two
        down-projections are replicated on the tensor-parallel ranks, each on its
        sequence-parallel share of the tokens (Megatron-Core builds them ``duplicated``);
        the up-projections are column-parallel like ``qkv``."""
        g, t, h, a = self.g, self.t, self.h, self.a
        ql = self.spec.q_lora_rank
        kvl, nope, rope, v = self.spec.mla_dims
        if op == "q_down":
            g.gemm(n, op, t, h, ql, sp="m", params=h * ql * own, **gp)
            g.edge(get("ln1"), n, "act")
        elif op == "q_ln":
            g.rowwise(n, "layernorm", op, t, ql, sp="rows", params=ql * own)
            g.edge(get("q_down"), n, "act")
        elif op in ("q_up", "q_proj"):
            k = ql if op == "q_up" else h
            g.gemm(n, op, t, k, a * (nope + rope), tp="n", params=k * a * (nope + rope) * own,
                   **gp)
            g.edge(get("q_ln" if op == "q_up" else "ln1"), n, "act")
        elif op == "kv_down":
            g.gemm(n, op, t, h, kvl + rope, sp="m", params=h * (kvl + rope) * own, **gp)
            g.edge(get("ln1"), n, "act")
        elif op == "kv_ln":
            g.rowwise(n, "layernorm", op, t, kvl, sp="rows", params=kvl * own)
            g.edge(get("kv_down"), n, "act")
        else:  # kv_up
            g.gemm(n, op, t, kvl, a * (nope + v), tp="n", params=kvl * a * (nope + v) * own,
                   **gp)
            g.edge(get("kv_ln"), n, "act")

    def _mla_backward(self, grads: list[str], stash, gemm_bwd) -> tuple[list[str], list[str]]:
        """Backward of MLA's projections from ``grads`` (the nodes holding the gradients of
        the queries, keys and values).  Returns (nodes holding the gradient of the block's
        normalised input, weight-gradient nodes)."""
        g, t, h, a, p, src = self.g, self.t, self.h, self.a, self.prefix, self.src
        ql = self.spec.q_lora_rank
        kvl, nope, rope, v = self.spec.mla_dims
        gp = self.gemm_precision

        def cast(name: str, elements: int, grad: list[str], key: str) -> list[str]:
            if not self.quantized:
                return grad
            return [self._dy_cast(name, elements, grad[0], key)] + grad[1:]

        def down_bwd(op: str, n: int, dout: list[str]) -> tuple[str, str]:
            # a replicated GEMM on this rank's sequence share: no tensor-parallel split
            dx = g.gemm(p + op + ".dX", op + ".dX", t, n, h, sp="m", precision=gp)
            dw = g.gemm(p + op + ".dW", op + ".dW", h, t, n, batch="k", sp="k",
                        wgrad=h * n, precision=gp)
            for dd in dout:
                g.edge(dd, dx, "grad")
                g.edge(dd, dw, "grad")
            stash(src["ln1"], dw)
            return dx, dw

        def norm_bwd(op: str, width: int, dx: str, x_in: str) -> str:
            n = g.elementwise(p + op + ".bwd", op + ".bwd", t * width, inputs=3,
                              flops_per_element=10.0, sp="elements", wgrad=width)
            g.edge(dx, n, "grad")
            stash(x_in, n)
            return n

        qw, kvw = a * (nope + rope), a * (nope + v)
        kv_dx, kv_dw = gemm_bwd("kv_up", t, kvl, kvw, src["kv_ln"],
                                cast("kv_up", t * kvw, grads, "tp"), "k", "n", 0)
        kv_ln = norm_bwd("kv_ln", kvl, kv_dx, src["kv_down"])
        # the shared rotary key's gradient joins the latent's on the way into kv_down
        kvd_dx, kvd_dw = down_bwd("kv_down", kvl + rope,
                                  cast("kv_down", t * (kvl + rope), [kv_ln, *grads], "sp"))
        if ql:
            q_dx, q_dw = gemm_bwd("q_up", t, ql, qw, src["q_ln"],
                                  cast("q_up", t * qw, grads, "tp"), "k", "n", 0)
            q_ln = norm_bwd("q_ln", ql, q_dx, src["q_down"])
            qd_dx, qd_dw = down_bwd("q_down", ql, cast("q_down", t * ql, [q_ln], "sp"))
            return [qd_dx, kvd_dx], [kv_dw, kv_ln, kvd_dw, q_dw, q_ln, qd_dw]
        q_dx, q_dw = gemm_bwd("q_proj", t, h, qw, src["ln1"],
                              cast("q_proj", t * qw, grads, "tp"), "k", "n", 0)
        return [q_dx, kvd_dx], [kv_dw, kv_ln, kvd_dw, q_dw]

    def _expert_tokens(self) -> int:
        """Routed tokens per expert of one micro-batch: the router spreads them evenly (the
        published MoE runs force the balance), up to the capacity or padded to it
        (:meth:`TransformerSpec.routed_rows`), rounded up.  The capacity is taken from the
        micro-batch's tokens; Megatron-Core takes it from each rank's sequence-parallel
        share, which differs only in the rounding up."""
        return -(-self._rows() // self.spec.num_moe_experts)

    def _rows(self) -> int:
        """Token copies the experts of this MoE layer process (t·topk when dropless)."""
        return self.spec.routed_rows(self.t)

    def _moe_forward(self, op: str, n: str, get, gp: dict, own: bool) -> None:
        """One node of an MoE layer's feed-forward part (Megatron-Core's MoELayer with the
        all-to-all token dispatcher; its all-to-alls are priced by the simulator).  Token
        dimensions carry the sequence-parallel key: tensor parallelism splits the tokens,
        never the experts; expert and expert tensor parallelism re-shard the expert GEMMs in
        the simulator (crossflow.sim.transformer.expert_shard)."""
        g = self.g
        # the MoE layer's own kernels are marked (the software profile's moe_efficiency);
        # the shared expert is a dense MLP beside the experts
        context = g.context
        g.context = context if op.startswith("shared_") else {**context, "moe_op": True}
        try:
            self._moe_node(op, n, get, gp, own)
        finally:
            g.context = context

    def _moe_node(self, op: str, n: str, get, gp: dict, own: bool) -> None:
        g, t, h, spec = self.g, self.t, self.h, self.spec
        E, k = spec.num_moe_experts, spec.moe_router_topk
        f, f_in, w = spec.moe_ffn, spec.moe_in_width, spec.moe_width
        me, rows = self._expert_tokens(), self._rows()
        act = "act"
        if op == "router":  # fp32 logits in Megatron; priced at the activations' type
            g.gemm(n, op, t, h, E, sp="m", params=h * E * own)
            g.edge(get("ln2"), n, act)
        elif op == "router_topk":  # softmax over the experts, then the top k
            g.rowwise(n, "softmax", op, t, E, sp="rows")
            g.edge(get("router"), n, act)
        elif op == "aux_loss":
            g.elementwise(n, op, t * E, flops_per_element=AUX_LOSS_FLOPS, sp="elements")
            g.edge(get("router_topk"), n, act)
        elif op == "latent_down":
            g.gemm(n, op, t, h, w, sp="m", params=h * w * own, **gp)
            g.edge(get("ln2"), n, act)
        elif op == "permute":  # gather each token's k copies into expert order
            g.elementwise(n, op, rows * w, flops_per_element=0.0, sp="elements")
            g.edge(get("latent_down" if spec.moe_latent_size else "ln2"), n, act)
            g.edge(get("router_topk"), n, act, t * k * 4)
        elif op == "expert_cast":
            self._quantize(n, rows * w, get("permute"), sp="elements",
                           expert_gathered="elements")
        elif op == "expert_fc1":
            g.gemm(n, op, me, w, f_in, count=E, sp="m", expert_tokens="m",
                   expert_width="n", **gp)
            g.edge(get("expert_cast" if self.quantized else "permute"), n, act)
        elif op == "expert_act":
            gated = spec.gated_linear_unit
            g.elementwise(n, "swiglu" if gated else "gelu", rows * f, inputs=1 + gated,
                          flops_per_element=SWIGLU_FLOPS if gated else GELU_FLOPS,
                          sp="elements")
            g.edge(get("expert_fc1"), n, act)
        elif op == "expert_fc2":
            g.gemm(n, op, me, f, w, count=E, sp="m", expert_tokens="m",
                   expert_width="k", **gp)
            g.edge(get("expert_act"), n, act)
        elif op == "unpermute":  # the k expert outputs of a token, weighted by its probs
            g.elementwise(n, op, t * w, inputs=k, flops_per_element=2.0 * k, sp="elements")
            g.edge(get("expert_fc2"), n, act)
        elif op == "latent_up":
            g.gemm(n, op, t, w, h, sp="m", params=w * h * own, **gp)
            g.edge(get("unpermute"), n, act)
        elif op == "shared_fc1":
            sf_in = (2 if spec.gated_linear_unit else 1) * spec.shared_ffn
            g.gemm(n, op, t, h, sf_in, tp="n", params=h * sf_in * own, **gp)
            g.edge(get("ln2"), n, act)
        elif op == "shared_act":
            gated = spec.gated_linear_unit
            g.elementwise(n, "swiglu" if gated else "gelu", t * spec.shared_ffn,
                          inputs=1 + gated,
                          flops_per_element=SWIGLU_FLOPS if gated else GELU_FLOPS,
                          tp="elements")
            g.edge(get("shared_fc1"), n, act)
        elif op == "shared_fc2":
            g.gemm(n, op, t, spec.shared_ffn, h, tp="k", params=spec.shared_ffn * h * own,
                   **gp)
            g.edge(get("shared_act"), n, act)
        else:
            raise ValueError(f"unknown block op {op!r}")

    def _moe_backward(self, dy: str, stash, gemm_bwd) -> tuple[list[str], list[str]]:
        """Backward of an MoE layer's feed-forward part from ``dy`` (the gradient of its
        output), with :meth:`backward`'s ``stash`` and ``gemm_bwd`` (a dense linear layer's
        dgrad and wgrad: the shared expert's).  Returns (nodes holding the gradient of its
        input, weight-gradient nodes)."""
        g, t, h, p, spec, src = self.g, self.t, self.h, self.prefix, self.spec, self.src
        E, k = spec.num_moe_experts, spec.moe_router_topk
        f, f_in, w = spec.moe_ffn, spec.moe_in_width, spec.moe_width
        latent = bool(spec.moe_latent_size)
        me, rows = self._expert_tokens(), self._rows()
        gp = self.gemm_precision
        gated = spec.gated_linear_unit
        context = g.context
        g.context = {**context, "moe_op": True}

        def replicated(name: str, d_in: int, d_out: int, grad: str, saved: str,
                       precision=None) -> tuple[str, str]:
            """dgrad and wgrad of a d_in -> d_out linear layer every tensor-parallel rank
            holds whole (the router, the latent projections) on its share of the tokens;
            its input ``saved`` is kept for the wgrad."""
            dx = g.gemm(p + name + ".dX", name + ".dX", t, d_out, d_in, sp="m",
                        precision=precision)
            dw = g.gemm(p + name + ".dW", name + ".dW", d_in, t, d_out, batch="k", sp="k",
                        wgrad=d_in * d_out, precision=precision)
            for node in (dx, dw):
                g.edge(grad, node, "grad")
            stash(saved, dw)
            return dx, dw

        wgrads: list[str] = []
        into = dy
        if latent:  # the up-projection's gradients first (its output is the layer's)
            into, udw = replicated("latent_up", w, h, dy, src["unpermute"], gp)
            wgrads.append(udw)
        # the output gradient goes back to each token's k expert rows, scaled by its probs
        n = g.elementwise(p + "unpermute.bwd", "unpermute.bwd", rows * w, inputs=1,
                          flops_per_element=1.0, sp="elements")
        g.edge(into, n, "grad")
        if self.quantized:
            n = self._dy_cast("expert_fc2", rows * w, n, "sp", expert_gathered="elements")
        dx2 = g.gemm(p + "expert_fc2.dX", "expert_fc2.dX", me, w, f, count=E, sp="m",
                     expert_tokens="m", expert_width="n", precision=gp)
        dw2 = g.gemm(p + "expert_fc2.dW", "expert_fc2.dW", f, me, w, count=E, batch="k",
                     sp="k", expert_tokens="k", expert_width="m", wgrad=E * f * w,
                     precision=gp)
        for node in (dx2, dw2):
            g.edge(n, node, "grad")
        stash(src["expert_act"], dw2)
        a = g.elementwise(p + "expert_act.bwd", "swiglu.bwd" if gated else "gelu.bwd",
                          rows * f, inputs=2 + gated, outputs=1 + gated,
                          flops_per_element=(2 * SWIGLU_FLOPS if gated else GELU_FLOPS),
                          sp="elements")
        g.edge(dx2, a, "grad")
        stash(src["expert_fc1"], a)
        if self.quantized:
            a = self._dy_cast("expert_fc1", rows * f_in, a, "sp")
        dx1 = g.gemm(p + "expert_fc1.dX", "expert_fc1.dX", me, f_in, w, count=E, sp="m",
                     expert_tokens="m", expert_width="k", precision=gp)
        dw1 = g.gemm(p + "expert_fc1.dW", "expert_fc1.dW", w, me, f_in, count=E,
                     batch="k", sp="k", expert_tokens="k", expert_width="n",
                     wgrad=E * w * f_in, precision=gp)
        for node in (dx1, dw1):
            g.edge(a, node, "grad")
        stash(src["expert_cast" if self.quantized else "permute"], dw1)
        # the k gradient copies summed back into token order
        back = g.elementwise(p + "permute.bwd", "permute.bwd", t * w, inputs=k,
                             flops_per_element=float(k), sp="elements")
        g.edge(dx1, back, "grad")
        if latent:  # and through the down-projection to the hidden width
            back, ddw = replicated("latent_down", h, w, back, src["ln2"], gp)
            wgrads.append(ddw)
        # router: the probabilities' gradient (softmax backward), then its GEMM
        r = g.elementwise(p + "router_topk.bwd", "softmax.bwd", t * E, inputs=2,
                          flops_per_element=3.0, sp="elements")
        g.edge(n, r, "grad")
        stash(src["router_topk"], r)
        rdx, rdw = replicated("router", h, E, r, src["ln2"])
        grads = [back, rdx]
        wgrads += [dw2, dw1, rdw]
        g.context = context
        if spec.shared_ffn:
            sf = spec.shared_ffn
            sf_in = (2 if gated else 1) * sf
            sdx2, sdw2 = gemm_bwd("shared_fc2", t, sf, h, src["shared_act"], dy, "n", "m", 0)
            sa = g.elementwise(p + "shared_act.bwd", "swiglu.bwd" if gated else "gelu.bwd",
                               t * sf, inputs=2 + gated, outputs=1 + gated,
                               flops_per_element=(2 * SWIGLU_FLOPS if gated else GELU_FLOPS),
                               tp="elements")
            g.edge(sdx2, sa, "grad")
            stash(src["shared_fc1"], sa)
            sdx1, sdw1 = gemm_bwd("shared_fc1", t, h, sf_in, src["ln2"], sa, "k", "n", 0)
            grads.append(sdx1)
            wgrads += [sdw2, sdw1]
        return grads, wgrads

    def _quantize(self, node: str, elements: int, src: str, *, outputs: int | None = None,
                  edge: str = "act", **shard) -> str:
        """Transformer Engine's quantization of ``src`` into the GEMM's format
        (:data:`QUANTIZE`: its reads of the bf16 tensor and, unless ``outputs`` says, the
        copies it writes), a node ``node`` sharded as ``shard`` says."""
        self.g.elementwise(node, self.cast, elements, inputs=self.cast_reads,
                           outputs=self.cast_writes if outputs is None else outputs,
                           precision=self.gemm_precision, flops_per_element=CAST_FLOPS,
                           **shard)
        self.g.edge(src, node, edge)
        return node

    def _norm_cast(self, norm: str, name: str) -> str:
        """The node the norm-fed GEMMs read: ``norm`` itself, or under NVFP4 the separate
        quantization of its output, on each rank's own rows before the sequence-parallel
        gather."""
        if not self.norm_cast:
            return norm
        return self._quantize(name, self.t * self.h, norm, sp="elements")

    def _dy_cast(self, name: str, elements: int, grad: str, key: str, **extra) -> str:
        """Transformer Engine's quantization of a GEMM's output gradient before the GEMM's
        dgrad and wgrad: read bf16 (FP8 once, NVFP4 twice: :data:`QUANTIZE`), write the
        quantized tensor and its (for NVFP4, rotated) transpose."""
        return self._quantize(self.prefix + name + ".dY_cast", elements, grad, outputs=2,
                              edge="grad", **{key: "elements"}, **extra)

    def backward(self, x: str, dy: str, *, rerun: bool) -> str:
        """Backward nodes; ``x`` is the block input, ``dy`` the node holding d(output);
        ``rerun``: the whole block's forward runs again first (full recomputation).

        Returns the node holding d(input)."""
        g, p = self.g, self.prefix
        if rerun:
            self.forward(x, "recompute")
            g.edge(dy, p + self.ops[0] + ".re", "control")
        g.context = {"phase": "bwd", "layer": self.layer, "unit": self.layer + 1}
        grad, wgrads = dy, []
        if "ln2" in self.ops:  # the feed-forward part (an MLP or an MoE layer)
            self._recompute(x, dy, self._ffn_recomputed())
            grad, wgrads = self._ffn_backward(x, dy)
        if "M" in self.kind:
            grad, mixer_wgrads = self._mamba_backward(x, grad)
            wgrads += mixer_wgrads
        elif self.mixer:
            grad, mixer_wgrads = self._attention_backward(x, grad)
            wgrads += mixer_wgrads
        # optimizer
        g.context = {"phase": "optimizer", "layer": self.layer, "unit": self.layer + 1}
        opt = _adam(g, p + "optimizer", sum(layer_params(self.spec, self.layer)))
        for node in wgrads:
            g.edge(node, opt, "wgrad", g.nodes[node]["wgrad_elements"] * self.bytes)
        return grad

    def _recompute(self, x: str, after: str, ops: set[str]) -> None:
        """Forward nodes of ``ops`` (in forward order) run again once ``after`` has run, as
        the backward that reads their outputs begins."""
        if not ops:
            return
        ordered = tuple(op for op in self.ops if op in ops)
        self.forward(x, "recompute", ordered)
        self.g.edge(after, self.prefix + ordered[0] + ".re", "control")
        self.g.context = {"phase": "bwd", "layer": self.layer, "unit": self.layer + 1}

    def _attention_recomputed(self, flash: bool) -> set[str]:
        """The attention part's ops that selective recomputation reruns (Megatron-Core's
        ``recompute_modules``): the core (``core_attn``; Korthikanti §5, or the fused flash
        core), MLA's up-projections and RoPE (``mla_up_proj``) and MLA's input norm, which
        no linear layer fuses (``layernorm``)."""
        modules, ops = self.recomputed, set()
        if "core_attn" in modules:
            ops.update(FLASH_SELECTIVE_OPS if flash else SELECTIVE_OPS)
        if self.mla and "mla_up_proj" in modules:
            ops.update(("q_up", "kv_up", "rope"))
        if self.mla and "layernorm" in modules:
            ops.add("ln1")
        return ops & set(self.ops)

    def _ffn_recomputed(self) -> set[str]:
        """The feed-forward part's ops that selective recomputation reruns: the whole MoE
        layer (``moe``: routing, the experts, and with them the token dispatch and combine)
        or its experts' activation (``moe_act``) and shared expert (``shared_experts``); the
        whole dense MLP, its norm included where fused into fc1 (``mlp``); the pre-MLP norm
        where it is not fused into a linear layer: every layer of an MoE model, a hybrid
        stack's MoE layers (``layernorm``)."""
        modules, ops = self.recomputed, set()
        ffn = set(self.ops[self.ops.index("ln2") + 1:-1])  # between ln2 and mlp_residual
        if self.moe and "moe" in modules:
            ops |= ffn
        if self.moe and "moe_act" in modules:
            ops.add("expert_act")
        if self.moe and "shared_experts" in modules:
            ops.update(("shared_fc1", "shared_act", "shared_fc2"))
        separate = self.spec.separate_pre_mlp_norm(self.kind)
        if not self.moe and "mlp" in modules:  # a separate norm's output is its input
            ops |= ffn if separate else ffn | {"ln2"}
        if "layernorm" in modules and separate:
            ops.add("ln2")
        return ops & set(self.ops)

    def _stash(self, u: str, v: str, nbytes: float | None = None) -> None:
        self.g.edge(u, v, "stash", nbytes)

    def _gemm_bwd(self, op: str, m: int, k: int, n: int, x_in: str, dout: str | list[str],
                  tp_dx: str, tp_dw: str, bias: int) -> tuple[str, str]:
        """A linear layer's dgrad and wgrad from the gradient(s) ``dout`` of its output
        (forward: an (m, k) × (k, n) GEMM whose input ``x_in`` the wgrad reads)."""
        g, p, gp = self.g, self.prefix, self.gemm_precision
        dx = g.gemm(p + op + ".dX", op + ".dX", m, n, k, tp=tp_dx, precision=gp)
        dw = g.gemm(p + op + ".dW", op + ".dW", k, m, n, batch="k", tp=tp_dw,
                    wgrad=k * n + bias, precision=gp)
        for dd in ([dout] if isinstance(dout, str) else dout):
            g.edge(dd, dx, "grad")
            g.edge(dd, dw, "grad")
        self._stash(x_in, dw)
        return dx, dw

    def _ffn_backward(self, x: str, dy: str) -> tuple[str, list[str]]:
        """Backward of the MLP or MoE part from ``dy``: (the node holding the gradient of
        its input, residual included, the weight-gradient nodes)."""
        g, t, h, f, p = self.g, self.t, self.h, self.f, self.prefix
        f_in, src, stash, gemm_bwd = self.f_in, self.src, self._stash, self._gemm_bwd
        n = self._dropout_backward(dy, "mlp_residual")
        if self.moe:
            mlp_grads, mlp_wgrads = self._moe_backward(n, stash, gemm_bwd)
        else:
            if self.quantized:
                n = self._dy_cast("mlp2", t * h, n, "sp")
            act_op = "swiglu" if self.spec.gated_linear_unit else "gelu"
            mlp2_dx, mlp2_dw = gemm_bwd("mlp2", t, f, h, src[act_op], n, "n", "m",
                                        self.bias * h)
            if act_op == "swiglu":
                n = g.elementwise(p + "swiglu.bwd", "swiglu.bwd", t * f, inputs=3,
                                  outputs=2, flops_per_element=2 * SWIGLU_FLOPS,
                                  tp="elements")
            else:
                n = g.elementwise(p + "gelu.bwd", "gelu.bwd", t * f, inputs=2,
                                  flops_per_element=GELU_FLOPS, tp="elements")
            g.edge(mlp2_dx, n, "grad")
            stash(src["mlp1"], n)
            mlp1_dx, mlp1_dw = gemm_bwd("mlp1", t, h, f_in, src["ln2"], n, "k", "n",
                                        self.bias * f_in)
            mlp_grads, mlp_wgrads = [mlp1_dx], [mlp2_dw, mlp1_dw]
        ln2 = g.elementwise(p + "ln2.bwd", "ln2.bwd", t * h, inputs=3,
                            flops_per_element=10.0, sp="elements", wgrad=self.norm)
        for node in mlp_grads:
            g.edge(node, ln2, "grad")
        g.edge(dy, ln2, "grad")  # the residual branch
        stash(src["proj_residual"] if self.mixer else x, ln2)
        return ln2, [*mlp_wgrads, ln2]

    def _dropout_backward(self, dy: str, residual: str) -> str:
        """The backward of a residual branch's dropout (the gradient times its mask), or
        ``dy`` itself without dropout (the add's backward is no kernel)."""
        if not self.spec.hidden_dropout:
            return dy
        g, p = self.g, self.prefix
        n = g.elementwise(p + residual + ".bwd", residual + ".bwd", self.t * self.h, inputs=2,
                          flops_per_element=DROPOUT_FLOPS, sp="elements")
        g.edge(dy, n, "grad")
        self._stash(self.src[residual], n)
        return n

    def _residual_backward(self, dy: str, proj: str) -> str:
        """The mixer's residual add backward from ``dy``, and under FP8 the cast of that
        gradient which the output projection ``proj``'s dgrad and wgrad read."""
        n = self._dropout_backward(dy, "proj_residual")
        return self._dy_cast(proj, self.t * self.h, n, "sp") if self.quantized else n

    def _attention_backward(self, x: str, dy: str) -> tuple[str, list[str]]:
        """Backward of the attention part from ``dy`` (the gradient of its output): (the
        node holding the gradient of the block's input, the weight-gradient nodes)."""
        g, t, h, s, a, b, p = self.g, self.t, self.h, self.s, self.a, self.b, self.prefix
        d, q, qkv_n, nb = self.d, self.q, self.qkv_n, self.bytes
        src, stash, gemm_bwd = self.src, self._stash, self._gemm_bwd
        flash = "attn" in self.ops
        n = self._residual_backward(dy, "proj")
        proj_in = src["proj_cast"] if self.quantized else src["attn" if flash else "av"]
        proj_dx, proj_dw = gemm_bwd("proj", t, q, h, proj_in, n, "n", "m", self.bias * h)
        qkv_src = src.get("rope") or src.get("qk_ln") or src["qkv"]
        self._recompute(x, proj_dx, self._attention_recomputed(flash))
        heads = b * a
        if flash:
            # the fused backward recomputes the scores tile by tile: QKᵀ, dV, dP, dQ, dK
            da = g.attention(p + "attn.bwd", "attn.bwd", heads, s, self.d_bwd, gemms=5,
                             causal=self.causal, window=self.window, tp="heads",
                             precision=self.attn_precision)
            g.edge(proj_dx, da, "grad")
            stash(qkv_src, da, t * qkv_n * nb)
            stash(src["attn"], da)
            grads: list[str] = [da]
        else:
            dp_ = g.gemm(p + "av.dP", "av.dP", s, d, s, count=heads, batch="count",
                         tp="count")
            dv = g.gemm(p + "av.dV", "av.dV", s, s, d, count=heads, batch="count",
                        tp="count")
            for node in (dp_, dv):
                g.edge(proj_dx, node, "grad")
            stash(qkv_src, dp_, t * q * nb)
            stash(src[self.probs], dv)
            n = dp_
            if self.probs == "attn_dropout":
                n = g.elementwise(p + "attn_dropout.bwd", "attn_dropout.bwd", heads * s * s,
                                  inputs=2, flops_per_element=DROPOUT_FLOPS, tp="elements")
                g.edge(dp_, n, "grad")
                stash(src["attn_dropout"], n)
            sm = g.elementwise(p + "softmax.bwd", "softmax.bwd", heads * s * s, inputs=2,
                               flops_per_element=3.0, tp="elements")
            g.edge(n, sm, "grad")
            stash(src["softmax"], sm)
            dq = g.gemm(p + "qk.dQ", "qk.dQ", s, s, self.dqk, count=heads, batch="count",
                        tp="count")
            dk = g.gemm(p + "qk.dK", "qk.dK", s, s, self.dqk, count=heads, batch="count",
                        tp="count")
            for node in (dq, dk):
                g.edge(sm, node, "grad")
                stash(qkv_src, node, t * q * nb)
            grads = [dq, dk, dv]
        if "rope" in src:
            r = g.elementwise(p + "rope.bwd", "rope.bwd", g.nodes[src["rope"]]["elements"],
                              flops_per_element=ROPE_FLOPS, tp="elements")
            for node in grads:
                g.edge(node, r, "grad")
            grads = [r]
        qk_norm = []
        if "qk_ln" in src:  # reads the gradient, the norm's input and its statistics
            n = g.elementwise(p + "qk_ln.bwd", "qk_ln.bwd", t * self.spec.qk_norm_width,
                              inputs=3, flops_per_element=10.0, tp="elements",
                              wgrad=self.spec.qk_norm_params)
            for node in grads:
                g.edge(node, n, "grad")
            stash(src["qkv"], n, t * self.spec.qk_norm_width * nb)
            grads = qk_norm = [n]
        if self.mla:
            qkv_dxs, qkv_dws = self._mla_backward(grads, stash, gemm_bwd)
        else:
            if self.quantized:
                grads = [self._dy_cast("qkv", t * qkv_n, grads[0], "tp")] + grads[1:]
            qkv_dx, qkv_dw = gemm_bwd("qkv", t, h, qkv_n, src["ln1"], grads, "k", "n",
                                      self.bias * qkv_n)
            qkv_dxs, qkv_dws = [qkv_dx], [qkv_dw]
        ln1 = g.elementwise(p + "ln1.bwd", "ln1.bwd", t * h, inputs=3,
                            flops_per_element=10.0, sp="elements", wgrad=self.norm)
        for node in qkv_dxs:
            g.edge(node, ln1, "grad")
        g.edge(dy, ln1, "grad")  # the residual branch
        stash(x, ln1)
        return ln1, [proj_dw, *qk_norm, *qkv_dws, ln1]

    def _mamba_backward(self, x: str, dy: str) -> tuple[str, list[str]]:
        """Backward of a Mamba-2 mixer from ``dy``: the output projection's, the gated
        norm's, the scan's (mamba_ssm's chunked backward: the in-chunk products as a flash
        backward of five, the state products' two gradients each), the convolution's and
        the input projection's; (the gradient of the block's input, weight gradients)."""
        g, t, h, p, spec = self.g, self.t, self.h, self.prefix, self.spec
        src, stash, gemm_bwd, nb = self.src, self._stash, self._gemm_bwd, self.bytes
        di, heads, P = spec.mamba_inner, spec.mamba_heads, spec.mamba_head_dim
        N, cw, chunks = spec.mamba_state_dim, spec.mamba_conv_width, self.ssd_chunks
        width = spec.mamba_in_width
        n = self._residual_backward(dy, "out_proj")
        out_in = src["out_cast"] if self.quantized else src["mamba_norm"]
        out_dx, out_dw = gemm_bwd("out_proj", t, di, h, out_in, n, "n", "m", 0)
        norm = g.elementwise(p + "mamba_norm.bwd", "mamba_norm.bwd", t * di, inputs=3,
                             outputs=2, flops_per_element=2 * MAMBA_NORM_FLOPS,
                             tp="elements", wgrad=di + 3 * heads)
        g.edge(out_dx, norm, "grad")
        stash(src["ssd_chunk"], norm, t * di * nb)
        stash(src["in_proj"], norm, t * di * nb)  # z
        chunk = g.attention(p + "ssd_chunk.bwd", "ssd_chunk.bwd", chunks, MAMBA_CHUNK,
                            self.ssd_width, gemms=5, causal=1, tp="heads")
        state = g.gemm(p + "ssd_state.bwd", "ssd_state.bwd", 4 * chunks * N, MAMBA_CHUNK, P,
                       tp="m")
        for node in (chunk, state):
            g.edge(norm, node, "grad")
            stash(src["conv1d"], node)
        conv = g.elementwise(p + "conv1d.bwd", "conv1d.bwd", t * cw, inputs=2,
                             flops_per_element=2 * MAMBA_CONV_FLOPS, tp="elements",
                             wgrad=(MAMBA_CONV_WIDTH + 1) * cw)
        for node in (chunk, state):
            g.edge(node, conv, "grad")
        stash(src["in_proj"], conv, t * cw * nb)
        grads = [conv, norm, chunk]  # x, B, C; z; dt
        if self.quantized:
            grads = [self._dy_cast("in_proj", t * width, grads[0], "tp")] + grads[1:]
        in_dx, in_dw = gemm_bwd("in_proj", t, h, width, src["ln1"], grads, "k", "n", 0)
        ln1 = g.elementwise(p + "ln1.bwd", "ln1.bwd", t * h, inputs=3,
                            flops_per_element=10.0, sp="elements", wgrad=self.norm)
        g.edge(in_dx, ln1, "grad")
        g.edge(dy, ln1, "grad")  # the residual branch
        stash(x, ln1)
        return ln1, [out_dw, norm, conv, in_dw, ln1]


def _adam(g: GraphBuilder, node: str, params: int) -> str:
    return g.elementwise(node, "optimizer", params, inputs=4, outputs=3,
                         flops_per_element=ADAM_FLOPS_PER_PARAM, batch=None, tp="elements",
                         precision="fp32")


def _mtp_projection(g: GraphBuilder, t: int, h: int, L: int) -> None:
    """One multi-token-prediction depth's own kernels (layer ``L + 1``, in the head's unit):
    Megatron-Core's ``MultiTokenPredictionLayer`` normalises the shifted inputs' embedding
    (``enorm``) and the previous depth's hidden states (``hnorm``), concatenates them,
    projects 2h -> h (``eh_proj``, column-parallel) and, after its layer, normalises again
    (``final_layernorm``).  Its embedding lookup, layer, output head and loss are the
    model's own kernels, priced as those (:mod:`crossflow.sim.training`)."""
    g.context = {"phase": "fwd", "layer": L + 1, "unit": L + 1}
    enorm = g.rowwise("mtp.enorm", "layernorm", "mtp_enorm", t, h, sp="rows", params=h)
    hnorm = g.rowwise("mtp.hnorm", "layernorm", "mtp_hnorm", t, h, sp="rows", params=h)
    cat = g.elementwise("mtp.concat", "mtp_concat", 2 * t * h, flops_per_element=0.0,
                        sp="elements")
    for norm in (enorm, hnorm):
        g.edge(norm, cat, "act")
    proj = g.gemm("mtp.eh_proj", "mtp_eh_proj", t, 2 * h, h, tp="n", params=2 * h * h)
    g.edge(cat, proj, "act")
    fln = g.rowwise("mtp.final_ln", "layernorm", "mtp_final_ln", t, h, sp="rows", params=h)
    g.edge(proj, fln, "act")
    g.context = {"phase": "bwd", "layer": L + 1, "unit": L + 1}
    dfln = g.elementwise("mtp.final_ln.bwd", "mtp_final_ln.bwd", t * h, inputs=2,
                         flops_per_element=10.0, sp="elements", wgrad=h)
    g.edge(proj, dfln, "stash")
    dx = g.gemm("mtp.eh_proj.dX", "mtp_eh_proj.dX", t, h, 2 * h, tp="k")
    dw = g.gemm("mtp.eh_proj.dW", "mtp_eh_proj.dW", 2 * h, t, h, batch="k", tp="n",
                wgrad=2 * h * h)
    for node in (dx, dw):
        g.edge(dfln, node, "grad")
    g.edge(cat, dw, "stash")
    for norm in (enorm, hnorm):
        dnorm = g.elementwise(f"{norm}.bwd", f"{g.nodes[norm]['name']}.bwd", t * h,
                              inputs=2, flops_per_element=10.0, sp="elements", wgrad=h)
        g.edge(dx, dnorm, "grad")
        g.edge(norm, dnorm, "stash")


@lru_cache(maxsize=16)  # GPT-3 175B's graph is ~6 MB
def _build(spec: TransformerSpec, b: int) -> nx.DiGraph:
    s, h, v, L = spec.seq_length, spec.hidden_size, spec.vocab_size, spec.num_layers
    t = b * s
    prec = spec.activation_precision
    nb = BYTES_PER_ELEMENT[prec]
    recompute = spec.activation_recompute
    tied = not spec.untie_embeddings_and_output_weights
    pos = s * h if spec.position_embedding_type == "learned_absolute" else 0
    g = GraphBuilder(
        prec, kind="transformer", name=spec.name, batch=b,
        microbatches=spec.global_batch_size // b, dp_mode="microbatches",
        pipeline_policy="megatron", pipeline_units=L + 2, kernel_types=("TP",),
        attention=attention_backend(spec), recompute=recompute, tied_embeddings=tied,
        num_layers=L, gemm_precision=spec.precision,
    )
    # embedding (unit 0)
    g.context = {"phase": "fwd", "layer": -1, "unit": 0}
    emb = g.embedding("emb.lookup", "embedding", t, h, v, tp="vocab", params=v * h)
    x = g.elementwise("emb.add_dropout", "embedding_dropout", t * h, inputs=2,
                      flops_per_element=DROPOUT_FLOPS + 1, sp="elements", params=pos)
    g.edge(emb, x, "act")
    # blocks
    blocks, inputs = [], []
    for layer in range(L):
        block = _Block(g, spec, b, layer)
        inputs.append(x)
        x = block.forward(x, "fwd")
        blocks.append(block)
    # head (unit L + 1)
    g.context = {"phase": "fwd", "layer": L, "unit": L + 1}
    norm = spec.norm_params  # the final norm's weights
    fln = g.rowwise("head.final_ln", "layernorm", "final_ln", t, h, sp="rows", params=norm)
    g.edge(x, fln, "act")
    logits = g.gemm("head.logits", "logits", t, h, v, tp="n",
                    params=0 if tied else v * h)
    g.edge(fln, logits, "act")
    ce = g.rowwise("head.cross_entropy", "softmax", "cross_entropy", t, v, tp="cols")
    g.edge(logits, ce, "act")
    g.context = {"phase": "bwd", "layer": L, "unit": L + 1}
    dce = g.elementwise("head.cross_entropy.bwd", "cross_entropy.bwd", t * v,
                        flops_per_element=2.0, tp="elements")
    g.edge(ce, dce, "stash")
    dlx = g.gemm("head.logits.dX", "logits.dX", t, v, h, tp="k")
    dlw = g.gemm("head.logits.dW", "logits.dW", h, t, v, batch="k", tp="n", wgrad=h * v)
    for node in (dlx, dlw):
        g.edge(dce, node, "grad")
    g.edge(fln, dlw, "stash")
    dfln = g.elementwise("head.final_ln.bwd", "final_ln.bwd", t * h, inputs=2,
                         flops_per_element=10.0, sp="elements", wgrad=norm)
    g.edge(dlx, dfln, "grad")
    g.edge(x, dfln, "stash")
    g.context = {"phase": "optimizer", "layer": L, "unit": L + 1}
    hopt = _adam(g, "head.optimizer", norm + (0 if tied else v * h))
    g.edge(dfln, hopt, "wgrad", norm * nb)
    if not tied:  # the output layer's own weight
        g.edge(dlw, hopt, "wgrad", v * h * nb)
    if spec.mtp_num_layers:
        _mtp_projection(g, t, h, L)
    # blocks, backward
    dy = dfln
    rerun = spec.recomputed_layers(L)  # the graph is one pipeline chunk
    for layer in reversed(range(L)):
        dy = blocks[layer].backward(inputs[layer], dy, rerun=layer < rerun)
    # embedding backward
    g.context = {"phase": "bwd", "layer": -1, "unit": 0}
    dxd = g.elementwise("emb.add_dropout.bwd", "embedding_dropout.bwd", t * h, inputs=2,
                        flops_per_element=DROPOUT_FLOPS, sp="elements", wgrad=pos)
    g.edge(dy, dxd, "grad")
    g.edge("emb.add_dropout", dxd, "stash")
    demb = g.embedding("emb.lookup.bwd", "embedding.bwd", t, h, v, tp="vocab", wgrad=v * h)
    g.edge(dxd, demb, "grad")
    g.context = {"phase": "optimizer", "layer": -1, "unit": 0}
    eopt = _adam(g, "emb.optimizer", v * h + pos)
    g.edge(demb, eopt, "wgrad", v * h * nb)
    g.edge(dxd, eopt, "wgrad", pos * nb)
    if tied:
        # the tied word embedding's gradient from the output head (Megatron all-reduces it
        # between the first and last pipeline stage)
        g.edge(dlw, eopt, "wgrad", v * h * nb)
    return g.build()
