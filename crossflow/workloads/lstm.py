"""The paper's LSTM language model (§9), unrolled over time (DeepFlow's LSTM mode,
reference ARCHITECTURE.md §5), with B = global batch, H = hidden, V = vocab, G = gates.

Per time step t: ``emb`` looks up B tokens; per layer l a ``cell`` GEMM
[x_t, h_{t-1}] (B, 2H) × W (2H, G·H) and one fused point-wise node ``gates`` (the gate
non-linearities, c_t = f·c_{t-1} + i·g, h_t = o·tanh(c_t): B·H elements, G+1 inputs —
the G pre-activations and c_{t-1} — 2 outputs, and (G+1) non-linear plus (G+4) add/multiply
FLOPs per element, which is DeepFlow's 5 + 8 for G = 4); then the vocabulary projection
``logits`` (B, H) × (H, V) and ``softmax`` (softmax with cross entropy, rows B, cols V).

Backward mirrors it in reverse time: ``gates.bwd`` point-wise, then ``cell.dX`` and
``cell.dW`` (each as many FLOPs as the forward GEMM), ``softmax.bwd``, ``logits.dX`` /
``logits.dW`` and the embedding's gradient scatter ``emb.bwd``.  One optimizer node per unit
(plain SGD: read parameter and gradient, write parameter, at the model's precision, as
DeepFlow's ``applyGrad``).

Node ids: ``t{step}.L{layer}.cell``, ``t{step}.emb``, ``t{step}.logits``, ... and
``L{layer}.optimizer``, ``emb.optimizer``, ``head.optimizer``.  Pipeline units (balanced
policy): 0 embedding, 1..L the layers, L+1 the projection and softmax, all time steps of a
layer in its unit.  Weights are shared over time: ``params`` is set on step 0's nodes only.
"""

from __future__ import annotations

from functools import lru_cache

import networkx as nx

from crossflow.arch.microarch import BYTES_PER_ELEMENT
from crossflow.config.workload import LstmSpec
from crossflow.errors import ConfigError
from crossflow.workloads.graph import GraphBuilder

#: The most kernels an unrolled LSTM graph may have: about 5 s to build and simulate one
#: iteration on one core (34,004 kernels, seq_length 2000 with 2 layers, take 2.7 s).  A
#: longer unroll is refused up front rather than taking minutes and gigabytes.
MAX_KERNELS = 50_000


def lstm_kernels(spec: LstmSpec) -> int:
    """The kernels (graph nodes) of ``spec``'s unrolled iteration, without building it.
    Per step: forward the embedding, per layer the cell and its gates, the projection and
    the softmax (2L + 3); backward per layer gates.bwd, cell.dX and cell.dW, then
    softmax.bwd, logits.dX, logits.dW and emb.bwd (3L + 4).  Plus one optimizer per
    pipeline unit (L + 2)."""
    L, S = spec.num_layers, spec.seq_length
    return S * (5 * L + 7) + L + 2


def check_size(spec: LstmSpec) -> None:
    """Refuse an unroll over :data:`MAX_KERNELS` kernels (a ConfigError naming the limit)."""
    n = lstm_kernels(spec)
    if n > MAX_KERNELS:
        L, S = spec.num_layers, spec.seq_length
        problem = (f"unrolls into {n:,} kernels per iteration; the graph simulator takes at "
                   f"most {MAX_KERNELS:,} (about 5 s per prediction)")
        longest = (MAX_KERNELS - L - 2) // (5 * L + 7)
        if longest >= 1:  # a shorter unroll of these layers fits
            raise ConfigError(problem, key="seq_length", value=S,
                              allowed=f"seq_length <= {longest} with {L} layers")
        deepest = (MAX_KERNELS - 7 * S - 2) // (5 * S + 1)
        raise ConfigError(problem, key="num_layers", value=L,
                          allowed=f"num_layers <= {max(deepest, 0)} with seq_length {S}"
                          if deepest >= 1 else f"num_layers <= {(MAX_KERNELS - 9) // 6} "
                          "with seq_length 1")


@lru_cache(maxsize=64)
def lstm_graph(spec: LstmSpec) -> nx.DiGraph:
    """The compute graph of one iteration (the whole global batch; data parallelism
    divides the batch).  Refused over :data:`MAX_KERNELS` kernels (:func:`check_size`)."""
    check_size(spec)
    B, H, V = spec.global_batch_size, spec.hidden_size, spec.vocab_size
    L, S, G = spec.num_layers, spec.seq_length, spec.num_gates
    g = GraphBuilder(spec.precision, kind="lstm", name=spec.name, batch=B, microbatches=1,
                     dp_mode="batch", pipeline_policy="balanced", pipeline_units=L + 2,
                     kernel_types=("RC", "CR"), num_layers=L)

    def ctx(phase: str, layer: int, step: int | None = None) -> None:
        g.context = {"phase": phase, "layer": layer, "unit": layer + 1}
        if step is not None:
            g.context["step"] = step

    if spec.implementation == "cudnn":
        return _cudnn_graph(g, ctx, B, H, V, L, S, G, BYTES_PER_ELEMENT[spec.precision])
    return _per_step_graph(g, ctx, B, H, V, L, S, G, BYTES_PER_ELEMENT[spec.precision])


def _cudnn_graph(g: GraphBuilder, ctx, B: int, H: int, V: int, L: int, S: int, G: int,
                 nb: int) -> nx.DiGraph:
    """cuDNN's LSTM (and any implementation that batches what does not recur): per layer the
    input half of the cell GEMM for all S steps at once, x (S·B, H) × W_x (H, G·H); step by
    step only h_{t-1} (B, H) × W_h (H, G·H) and the gates; the projection and softmax once
    over all S·B positions.  Backward: per layer, step by step in reverse time the gates'
    gradient and dh_{t-1} = dgates_t × W_hᵀ; then once for all steps the input gradient
    dgates × W_xᵀ and the weight gradient [x, h_{t-1}]ᵀ × dgates (k = S·B).  The same GEMM
    FLOPs and parameters as the per-step formulation, in fewer, larger kernels: on an H200
    it is within 10 % of cuDNN's measured iterations where the per-step one is up to 89 %
    slow (docs/validation.md, "Measured on an H200")."""
    cell_params, logit_params = _params(H, V, G)
    SB = S * B

    # forward, layer by layer
    ctx("fwd", -1)
    x = [g.embedding(f"t{t}.emb", "embedding", B, H, V, params=V * H * (t == 0))
         for t in range(S)]
    for layer in range(L):
        ctx("fwd", layer)
        inp = g.gemm(f"L{layer}.input", "cell.input", SB, H, G * H,
                     params=H * G * H + G * H)
        for t in range(S):
            g.edge(x[t], inp, "act", B * H * nb)
        outs = []
        for t in range(S):
            ctx("fwd", layer, t)
            p = f"t{t}.L{layer}."
            cell = g.gemm(p + "cell", "cell", B, H, G * H, params=H * G * H * (t == 0))
            gates = _gates(g, p, B, H, G)
            g.edge(inp, gates, "act", B * G * H * nb)
            g.edge(cell, gates, "act")
            if t:
                g.edge(outs[-1], cell, "act", B * H * nb)      # h_{t-1}
                g.edge(outs[-1], gates, "act", B * H * nb)     # c_{t-1}
            outs.append(gates)
        x = outs
    ctx("fwd", L)
    logits = g.gemm("logits", "logits", SB, H, V, params=logit_params)
    for t in range(S):
        g.edge(x[t], logits, "act", B * H * nb)
    sm = g.rowwise("softmax", "softmax", "softmax", SB, V)
    g.edge(logits, sm, "act")

    # backward
    wgrads: dict[int, list[str]] = {}
    ctx("bwd", L)
    dsm = g.elementwise("softmax.bwd", "softmax.bwd", SB * V, flops_per_element=2.0)
    g.edge(sm, dsm, "stash")
    dx = g.gemm("logits.dX", "logits.dX", SB, V, H)
    dw = g.gemm("logits.dW", "logits.dW", H, SB, V, batch="k", wgrad=H * V + V)
    for n in (dx, dw):
        g.edge(dsm, n, "grad")
    for t in range(S):
        g.edge(f"t{t}.L{L - 1}.gates", dw, "stash", B * H * nb)
    wgrads[L] = [dw]
    dh_in = dx          # the gradient flowing into the layer from above, all steps
    for layer in reversed(range(L)):
        dgs = []
        for t in reversed(range(S)):
            ctx("bwd", layer, t)
            dg = _gates_bwd(g, layer, t, S, dh_in, B, H, G, nb)
            cdx = g.gemm(f"t{t}.L{layer}.cell.dX", "cell.dX", B, G * H, H)   # dh_{t-1}
            g.edge(dg, cdx, "grad")
            dgs.append(dg)
        ctx("bwd", layer)
        ldx = g.gemm(f"L{layer}.dX", "cell.input.dX", SB, G * H, H)
        ldw = g.gemm(f"L{layer}.dW", "cell.dW", 2 * H, SB, G * H, batch="k",
                     wgrad=cell_params)
        for dg in dgs:
            g.edge(dg, ldx, "grad", B * G * H * nb)
            g.edge(dg, ldw, "grad", B * G * H * nb)
        g.edge(f"L{layer}.input", ldw, "stash", SB * H * nb)
        wgrads[layer] = [ldw]
        dh_in = ldx
    ctx("bwd", -1)
    demb = g.embedding("emb.bwd", "embedding.bwd", SB, H, V, wgrad=SB * H)
    g.edge(dh_in, demb, "grad", SB * H * nb)
    wgrads[-1] = [demb]
    return _optimizer(g, ctx, wgrads, H, V, L, cell_params, logit_params, nb)


def _optimizer(g: GraphBuilder, ctx, wgrads: dict[int, list[str]], H: int, V: int, L: int,
               cell_params: int, logit_params: int, nb: int) -> nx.DiGraph:
    """One SGD node per pipeline unit, after its weight gradients."""
    for layer, params, name in ((-1, V * H, "emb"), *((i, cell_params, f"L{i}")
                                for i in range(L)), (L, logit_params, "head")):
        ctx("optimizer", layer)
        opt = g.elementwise(f"{name}.optimizer", "optimizer", params, inputs=2,
                            flops_per_element=2.0, batch=None)
        for n in wgrads[layer]:
            g.edge(n, opt, "wgrad", g.nodes[n]["wgrad_elements"] * nb)
    return g.build()


def _pointwise_flops(G: int) -> float:
    """FLOPs per element of the gates node: G + 1 non-linear and G + 4 add / multiply."""
    return float((G + 1) + (G + 4))


def _params(H: int, V: int, G: int) -> tuple[int, int]:
    """(cell parameters with bias, projection parameters with bias)."""
    return 2 * H * G * H + G * H, H * V + V


def _gates(g: GraphBuilder, p: str, B: int, H: int, G: int) -> str:
    """The fused point-wise node of one cell step (module docstring)."""
    return g.elementwise(p + "gates", "gates", B * H, inputs=G + 1, outputs=2,
                         flops_per_element=_pointwise_flops(G))


def _gates_bwd(g: GraphBuilder, layer: int, t: int, S: int, dh: str, B: int, H: int, G: int,
               nb: int) -> str:
    """The gates' gradient at step ``t`` of ``layer``: from ``dh`` (the gradient from
    above), the step's stashed gates, and dh_t / dc_t from step t + 1."""
    p = f"t{t}.L{layer}."
    dg = g.elementwise(p + "gates.bwd", "gates.bwd", B * H, inputs=G + 3, outputs=G + 1,
                       flops_per_element=2 * _pointwise_flops(G))
    g.edge(dh, dg, "grad", B * H * nb)
    g.edge(p + "gates", dg, "stash")
    if t < S - 1:
        nxt = f"t{t + 1}.L{layer}."
        g.edge(nxt + "cell.dX", dg, "grad", B * H * nb)
        g.edge(nxt + "gates.bwd", dg, "grad", B * H * nb)
    return dg


def _per_step_graph(g: GraphBuilder, ctx, B: int, H: int, V: int, L: int, S: int, G: int,
                    nb: int) -> nx.DiGraph:
    """The paper's formulation, every GEMM step by step (the module's docstring)."""
    cell_params, logit_params = _params(H, V, G)

    # forward
    for t in range(S):
        first = t == 0
        ctx("fwd", -1, t)
        x = g.embedding(f"t{t}.emb", "embedding", B, H, V, params=V * H * first)
        for layer in range(L):
            ctx("fwd", layer, t)
            p = f"t{t}.L{layer}."
            cell = g.gemm(p + "cell", "cell", B, 2 * H, G * H, params=cell_params * first)
            g.edge(x, cell, "act")
            gates = _gates(g, p, B, H, G)
            g.edge(cell, gates, "act")
            if t:
                prev = f"t{t - 1}.L{layer}.gates"
                g.edge(prev, cell, "act", B * H * nb)  # h_{t-1}
                g.edge(prev, gates, "act", B * H * nb)  # c_{t-1}
            x = gates
        ctx("fwd", L, t)
        logits = g.gemm(f"t{t}.logits", "logits", B, H, V, params=logit_params * first)
        g.edge(x, logits, "act", B * H * nb)
        sm = g.rowwise(f"t{t}.softmax", "softmax", "softmax", B, V)
        g.edge(logits, sm, "act")

    # backward, in reverse time
    wgrads: dict[int, list[str]] = {}
    for t in reversed(range(S)):
        ctx("bwd", L, t)
        dsm = g.elementwise(f"t{t}.softmax.bwd", "softmax.bwd", B * V, flops_per_element=2.0)
        g.edge(f"t{t}.softmax", dsm, "stash")
        dx = g.gemm(f"t{t}.logits.dX", "logits.dX", B, V, H)
        # shared weights: their gradient accumulates over the steps and is complete, and
        # all-reduced over data parallelism once, after step 0's (the last backward step)
        last = t == 0
        dw = g.gemm(f"t{t}.logits.dW", "logits.dW", H, B, V, batch="k",
                    wgrad=(H * V + V) * last)
        for n in (dx, dw):
            g.edge(dsm, n, "grad")
        g.edge(f"t{t}.L{L - 1}.gates", dw, "stash", B * H * nb)
        wgrads.setdefault(L, []).append(dw)
        dh = dx
        for layer in reversed(range(L)):
            ctx("bwd", layer, t)
            p = f"t{t}.L{layer}."
            dg = _gates_bwd(g, layer, t, S, dh, B, H, G, nb)
            cdx = g.gemm(p + "cell.dX", "cell.dX", B, G * H, 2 * H)
            cdw = g.gemm(p + "cell.dW", "cell.dW", 2 * H, B, G * H, batch="k",
                         wgrad=cell_params * last)
            for n in (cdx, cdw):
                g.edge(dg, n, "grad")
            below = f"t{t}.L{layer - 1}.gates" if layer else f"t{t}.emb"
            g.edge(below, cdw, "stash", B * H * nb)
            if t:
                g.edge(f"t{t - 1}.L{layer}.gates", cdw, "stash", B * H * nb)
            wgrads.setdefault(layer, []).append(cdw)
            dh = cdx
        ctx("bwd", -1, t)
        demb = g.embedding(f"t{t}.emb.bwd", "embedding.bwd", B, H, V, wgrad=B * H)
        g.edge(dh, demb, "grad", B * H * nb)
        wgrads.setdefault(-1, []).append(demb)

    return _optimizer(g, ctx, wgrads, H, V, L, cell_params, logit_params, nb)
