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

Recomputation (``activation_recompute``): ``selective`` recomputes the attention core whose
activations are large but cheap (QKᵀ, softmax, dropout; Korthikanti §5) just before its
backward; ``full`` checkpoints each block's input and recomputes the whole block forward
before its backward (SC21's "activation recomputation").  Recomputed nodes have phase
``recompute`` and ids ending in ``.re``.

An optimizer node per unit (Adam with fp32 master weights, states and gradients: reads
param, grad, m, v and writes param, m, v) runs once per iteration.
"""

from __future__ import annotations

from functools import lru_cache

import networkx as nx

from crossflow.arch.microarch import BYTES_PER_ELEMENT
from crossflow.config.workload import TransformerSpec
from crossflow.errors import ConfigError
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
#: Adam: FLOPs per parameter (moments, bias correction, sqrt, divide, update, weight decay)
ADAM_FLOPS_PER_PARAM = 12.0
#: GeLU (tanh form) and dropout arithmetic per element; SiLU(gate)·up; rotary (2 mul, 1 add
#: per element and the sin/cos); FP8 cast (amax, scale, convert)
GELU_FLOPS = 8.0
SWIGLU_FLOPS = 6.0
ROPE_FLOPS = 3.0
CAST_FLOPS = 2.0
DROPOUT_FLOPS = 2.0


def block_ops(spec: TransformerSpec) -> tuple[str, ...]:
    """The forward nodes of one block of ``spec``, in order."""
    attention = (("attn",) if attention_backend(spec) == "flash"
                 else ("qk", "softmax", "attn_dropout", "av"))
    return (("ln1", "qkv") + (("rope",) if spec.position_embedding_type == "rope" else ())
            + attention + (("proj_cast",) if spec.precision == "fp8" else ())
            + ("proj", "proj_residual", "ln2", "mlp1",
               "swiglu" if spec.gated_linear_unit else "gelu", "mlp2", "mlp_residual"))


def attention_backend(spec: TransformerSpec) -> str:
    """The attention kernel the graph uses: the workload's, else unfused."""
    return spec.attention_backend or "unfused"


def transformer_graph(spec: TransformerSpec, *, micro_batch_size: int | None = None
                      ) -> nx.DiGraph:
    """The compute graph of one micro-batch (``micro_batch_size`` overrides the spec's)."""
    b = micro_batch_size or spec.micro_batch_size
    if spec.global_batch_size % b:
        raise ConfigError(f"must divide the workload's global_batch_size "
                          f"({spec.global_batch_size})", key="micro_batch_size", value=b)
    return _build(spec, b)


def block_params(spec: TransformerSpec) -> int:
    """Parameters of one block: QKV, projection and MLP weights with biases, two layernorms
    (12h² + 13h for GPT-3's block)."""
    h, f = spec.hidden_size, spec.ffn
    qkv, q, f_in = spec.qkv_width, spec.q_width, spec.mlp_in_width
    return h * qkv + qkv + q * h + h + h * f_in + f_in + f * h + h + 4 * h


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
        self.fp8 = spec.precision == "fp8"
        self.causal = int(spec.causal)
        self.ops = block_ops(spec)
        self.prefix = f"L{layer}."
        self.src: dict[str, str] = {}  # op -> node holding its (latest) forward output

    def forward(self, x: str, phase: str, ops: tuple[str, ...] | None = None) -> str:
        """Forward nodes of ``ops``; returns the block output node."""
        g, t, h, s, a, f, b = self.g, self.t, self.h, self.s, self.a, self.f, self.b
        d, q, qkv_n, f_in = self.d, self.q, self.qkv_n, self.f_in
        ops = ops or self.ops
        gp = {"precision": self.gemm_precision}
        suffix = "" if phase == "fwd" else ".re"
        own = phase == "fwd"
        g.context = {"phase": phase, "layer": self.layer, "unit": self.layer + 1}
        p = self.prefix
        new: dict[str, str] = {}

        def node(op: str) -> str:
            return p + op + suffix

        def get(op: str) -> str:
            return new.get(op) or self.src[op]

        def qkv_out() -> str:  # rotary embedding rewrites q and k in place
            return get("rope") if "rope" in self.ops else get("qkv")

        act = "act"
        for op in ops:
            n = node(op)
            if op == "ln1":
                g.rowwise(n, "layernorm", op, t, h, sp="rows", params=2 * h * own)
                g.edge(x, n, act if own else "stash")
            elif op == "qkv":
                g.gemm(n, op, t, h, qkv_n, tp="n", params=(h * qkv_n + qkv_n) * own, **gp)
                g.edge(get("ln1"), n, act)
            elif op == "rope":
                # q and k: (heads + query groups) · head_dim per token
                g.elementwise(n, op, t * (q + self.spec.query_groups * d),
                              flops_per_element=ROPE_FLOPS, tp="elements")
                g.edge(get("qkv"), n, act)
            elif op == "attn":
                g.attention(n, op, b * a, s, d, gemms=2, causal=self.causal, tp="heads")
                g.edge(qkv_out(), n, "act" if "qkv" in new else "stash", t * qkv_n * self.bytes)
            elif op == "qk":
                g.gemm(n, op, s, d, s, count=b * a, batch="count", tp="count")
                g.edge(qkv_out(), n, "act" if "qkv" in new else "stash",
                       2 * t * q * self.bytes)
            elif op == "softmax":
                g.rowwise(n, "softmax", op, b * a * s, s, tp="rows")
                g.edge(get("qk"), n, act)
            elif op == "attn_dropout":
                g.elementwise(n, op, b * a * s * s, flops_per_element=DROPOUT_FLOPS,
                              tp="elements")
                g.edge(get("softmax"), n, act)
            elif op == "av":
                g.gemm(n, op, s, s, d, count=b * a, batch="count", tp="count")
                g.edge(get("attn_dropout"), n, act)
                g.edge(qkv_out(), n, act, t * q * self.bytes)
            elif op == "proj_cast":
                g.elementwise(n, "fp8_cast", t * q, inputs=2, outputs=1, precision="fp8",
                              flops_per_element=CAST_FLOPS, tp="elements")
                g.edge(get("attn" if "attn" in self.ops else "av"), n, act)
            elif op == "proj":
                g.gemm(n, op, t, q, h, tp="k", params=(q * h + h) * own, **gp)
                g.edge(get("proj_cast" if self.fp8 else
                           ("attn" if "attn" in self.ops else "av")), n, act)
            elif op == "proj_residual":
                g.elementwise(n, op, t * h, inputs=2, flops_per_element=DROPOUT_FLOPS + 1,
                              sp="elements")
                g.edge(get("proj"), n, act)
                g.edge(x, n, act if own else "stash")
            elif op == "ln2":
                g.rowwise(n, "layernorm", op, t, h, sp="rows", params=2 * h * own)
                g.edge(get("proj_residual"), n, act)
            elif op == "mlp1":
                g.gemm(n, op, t, h, f_in, tp="n", params=(h * f_in + f_in) * own, **gp)
                g.edge(get("ln2"), n, act)
            elif op == "gelu":
                g.elementwise(n, op, t * f, flops_per_element=GELU_FLOPS, tp="elements")
                g.edge(get("mlp1"), n, act)
            elif op == "swiglu":
                g.elementwise(n, op, t * f, inputs=2, flops_per_element=SWIGLU_FLOPS,
                              tp="elements")
                g.edge(get("mlp1"), n, act)
            elif op == "mlp2":
                g.gemm(n, op, t, f, h, tp="k", params=(f * h + h) * own, **gp)
                g.edge(get("swiglu" if self.spec.gated_linear_unit else "gelu"), n, act)
            elif op == "mlp_residual":
                g.elementwise(n, op, t * h, inputs=2, flops_per_element=DROPOUT_FLOPS + 1,
                              sp="elements")
                g.edge(get("mlp2"), n, act)
                g.edge(get("proj_residual"), n, act)
            new[op] = n
        self.src.update(new)
        return new.get("mlp_residual", "")

    def _dy_cast(self, name: str, elements: int, grad: str, key: str) -> str:
        """FP8: Transformer Engine's cast-transpose of a GEMM's output gradient (read bf16,
        write the FP8 tensor and its transpose) before the GEMM's dgrad and wgrad."""
        n = self.g.elementwise(self.prefix + name + ".dY_cast", "fp8_cast", elements,
                               inputs=2, outputs=2, precision="fp8",
                               flops_per_element=CAST_FLOPS, **{key: "elements"})
        self.g.edge(grad, n, "grad")
        return n

    def backward(self, x: str, dy: str, recompute: str) -> str:
        """Backward nodes; ``x`` is the block input, ``dy`` the node holding d(output).

        Returns the node holding d(input)."""
        g, t, h, s, a, f, b, p = (self.g, self.t, self.h, self.s, self.a, self.f, self.b,
                                  self.prefix)
        d, q, qkv_n, f_in = self.d, self.q, self.qkv_n, self.f_in
        nb = self.bytes
        gp = self.gemm_precision
        flash = "attn" in self.ops
        if recompute == "full":
            self.forward(x, "recompute")
            g.edge(dy, p + "ln1.re", "control")
        g.context = {"phase": "bwd", "layer": self.layer, "unit": self.layer + 1}
        src = self.src

        def stash(u: str, v: str, nbytes: float | None = None) -> None:
            g.edge(u, v, "stash", nbytes)

        def gemm_bwd(op: str, m: int, k: int, n: int, x_in: str, dout: str | list[str],
                     tp_dx: str, tp_dw: str, bias: int) -> tuple[str, str]:
            dx = g.gemm(p + op + ".dX", op + ".dX", m, n, k, tp=tp_dx, precision=gp)
            dw = g.gemm(p + op + ".dW", op + ".dW", k, m, n, batch="k", tp=tp_dw,
                        wgrad=k * n + bias, precision=gp)
            for dd in ([dout] if isinstance(dout, str) else dout):
                g.edge(dd, dx, "grad")
                g.edge(dd, dw, "grad")
            stash(x_in, dw)
            return dx, dw

        # MLP
        n = g.elementwise(p + "mlp_residual.bwd", "mlp_residual.bwd", t * h, inputs=2,
                          flops_per_element=DROPOUT_FLOPS, sp="elements")
        g.edge(dy, n, "grad")
        stash(src["mlp_residual"], n)
        if self.fp8:
            n = self._dy_cast("mlp2", t * h, n, "sp")
        act_op = "swiglu" if self.spec.gated_linear_unit else "gelu"
        mlp2_dx, mlp2_dw = gemm_bwd("mlp2", t, f, h, src[act_op], n, "n", "m", h)
        if act_op == "swiglu":
            n = g.elementwise(p + "swiglu.bwd", "swiglu.bwd", t * f, inputs=3, outputs=2,
                              flops_per_element=2 * SWIGLU_FLOPS, tp="elements")
        else:
            n = g.elementwise(p + "gelu.bwd", "gelu.bwd", t * f, inputs=2,
                              flops_per_element=GELU_FLOPS, tp="elements")
        g.edge(mlp2_dx, n, "grad")
        stash(src["mlp1"], n)
        mlp1_dx, mlp1_dw = gemm_bwd("mlp1", t, h, f_in, src["ln2"], n, "k", "n", f_in)
        ln2 = g.elementwise(p + "ln2.bwd", "ln2.bwd", t * h, inputs=3,
                            flops_per_element=10.0, sp="elements", wgrad=2 * h)
        g.edge(mlp1_dx, ln2, "grad")
        g.edge(dy, ln2, "grad")  # the residual branch
        stash(src["proj_residual"], ln2)
        # attention
        n = g.elementwise(p + "proj_residual.bwd", "proj_residual.bwd", t * h, inputs=2,
                          flops_per_element=DROPOUT_FLOPS, sp="elements")
        g.edge(ln2, n, "grad")
        stash(src["proj_residual"], n)
        if self.fp8:
            n = self._dy_cast("proj", t * h, n, "sp")
        proj_in = src["proj_cast"] if self.fp8 else src["attn" if flash else "av"]
        proj_dx, proj_dw = gemm_bwd("proj", t, q, h, proj_in, n, "n", "m", h)
        qkv_src = src["rope"] if "rope" in src else src["qkv"]
        if recompute == "selective":
            ops = FLASH_SELECTIVE_OPS if flash else SELECTIVE_OPS
            self.forward("", "recompute", ops)
            g.edge(proj_dx, p + ops[0] + ".re", "control")
            g.context = {"phase": "bwd", "layer": self.layer, "unit": self.layer + 1}
        heads = b * a
        if flash:
            # the fused backward recomputes the scores tile by tile: QKᵀ, dV, dP, dQ, dK
            da = g.attention(p + "attn.bwd", "attn.bwd", heads, s, d, gemms=5,
                             causal=self.causal, tp="heads")
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
            stash(src["attn_dropout"], dv)
            n = g.elementwise(p + "attn_dropout.bwd", "attn_dropout.bwd", heads * s * s,
                              inputs=2, flops_per_element=DROPOUT_FLOPS, tp="elements")
            g.edge(dp_, n, "grad")
            stash(src["attn_dropout"], n)
            sm = g.elementwise(p + "softmax.bwd", "softmax.bwd", heads * s * s, inputs=2,
                               flops_per_element=3.0, tp="elements")
            g.edge(n, sm, "grad")
            stash(src["softmax"], sm)
            dq = g.gemm(p + "qk.dQ", "qk.dQ", s, s, d, count=heads, batch="count",
                        tp="count")
            dk = g.gemm(p + "qk.dK", "qk.dK", s, s, d, count=heads, batch="count",
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
        if self.fp8:
            grads = [self._dy_cast("qkv", t * qkv_n, grads[0], "tp")] + grads[1:]
        qkv_dx, qkv_dw = gemm_bwd("qkv", t, h, qkv_n, src["ln1"], grads, "k", "n", qkv_n)
        ln1 = g.elementwise(p + "ln1.bwd", "ln1.bwd", t * h, inputs=3,
                            flops_per_element=10.0, sp="elements", wgrad=2 * h)
        g.edge(qkv_dx, ln1, "grad")
        g.edge(ln2, ln1, "grad")  # the residual branch
        stash(x, ln1)
        # optimizer
        g.context = {"phase": "optimizer", "layer": self.layer, "unit": self.layer + 1}
        opt = _adam(g, p + "optimizer", block_params(self.spec))
        for node in (mlp2_dw, mlp1_dw, ln2, proj_dw, qkv_dw, ln1):
            g.edge(node, opt, "wgrad", g.nodes[node]["wgrad_elements"] * nb)
        return ln1


def _adam(g: GraphBuilder, node: str, params: int) -> str:
    return g.elementwise(node, "optimizer", params, inputs=4, outputs=3,
                         flops_per_element=ADAM_FLOPS_PER_PARAM, batch=None, tp="elements",
                         precision="fp32")


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
    fln = g.rowwise("head.final_ln", "layernorm", "final_ln", t, h, sp="rows", params=2 * h)
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
                         flops_per_element=10.0, sp="elements", wgrad=2 * h)
    g.edge(dlx, dfln, "grad")
    g.edge(x, dfln, "stash")
    g.context = {"phase": "optimizer", "layer": L, "unit": L + 1}
    hopt = _adam(g, "head.optimizer", 2 * h + (0 if tied else v * h))
    g.edge(dfln, hopt, "wgrad", 2 * h * nb)
    if not tied:  # the output layer's own weight
        g.edge(dlw, hopt, "wgrad", v * h * nb)
    # blocks, backward
    dy = dfln
    for layer in reversed(range(L)):
        dy = blocks[layer].backward(inputs[layer], dy, recompute)
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
