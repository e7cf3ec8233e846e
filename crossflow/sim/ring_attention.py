"""Context parallelism as Transformer Engine's ring attention runs it.

Megatron-Core's context parallelism (``cp_comm_type`` "p2p", its default) calls Transformer
Engine's ``AttnFuncWithCPAndKVP2P`` (transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py).  What one rank's layer does there, and what
this module prices:

* Load balancing under a causal mask: each sequence is cut into 2·cp chunks of
  c = s / (2·cp) tokens and rank r holds chunks r and 2·cp−1−r (``get_batch_on_this_cp_rank``),
  so every ring step does the same work.
* Forward, cp steps of one flash-attention kernel each: step 0 the rank's own two chunks
  against themselves under the causal mask (the work of a causal square of 2c); every
  later step, with the keys and values of another rank, two c × c blocks without a mask —
  the rank's two query chunks against the first chunk of the received keys ("lower
  triangle"), or its second query chunk against both ("upper triangle"), the same work.
  Without a causal mask each step is the rank's s/cp queries against s/cp keys.  The keys
  and values for step i+1 travel while step i's kernel runs; after the last step the
  partial outputs are merged, one pass over the output per step (out·exp(lse_i − lse)).
* Backward, cp steps of the flash backward kernel on the same blocks, each step's transfer
  (keys and values at the first step, keys, values and their gradients' partial sums
  after, the gradients alone at the last) behind that step's kernel only: the step waits
  for it before adding into the received gradient buffer.  Each step adds its dq and dk,
  dv into the accumulators.

The kernels are priced as the rest of the block is (:func:`crossflow.sim.pricing.node_cost`
through :func:`crossflow.sim.transformer.price_nodes`), so the extra launches and the
memory-bound passes fall in the pass's time.  The rank modelled is the last (r = cp−1,
every later step a "lower triangle"): its merges and dq additions are over its whole
output, the larger for grouped-query attention, whose keys and values are smaller than
the queries.  Its forward also merges the steps' softmax log-sum-exps, one fp32 value per
query row and head: the first step's copied (``torch.clone(softmax_lse_per_step[0])``),
each later one folded in (``flash_attn_fwd_softmax_lse_correction``: max, min, exp, log1p,
add — one fused kernel reading both, writing one), cp kernels of 4 bytes per row and head
against the output merges' 2·head_dim; its backward reads the log-sum-exp as it is (the
second-half copy is for ranks r < cp−1).
"""

from __future__ import annotations

from crossflow.workloads.graph import node_flops

#: FLOPs per query row and head of a log-sum-exp merge (Transformer Engine's
#: ``flash_attn_fwd_softmax_lse_correction``: max, min, subtract, exp, log1p, add)
LSE_MERGE_FLOPS = 6.0


def ring_nodes(attn: dict, cp: int, kv_elements: int) -> list[dict]:
    """The kernels that replace one flash-attention node on a context-parallel rank.

    ``attn`` is the node's tensor-parallel shard over the whole sequence (``heads`` is the
    micro-batch's heads on this rank, ``seq`` the full sequence); ``kv_elements`` the
    rank's keys and values of its 2 chunks (2·b·s/cp·query groups·head_dim).  A forward
    node (2 GEMMs) gives the forward ring, a backward one (5) the backward ring.
    """
    heads, s, d = attn["heads"], attn["seq"], attn["head_dim"]
    causal = bool(attn["causal"])
    local = s // cp  # this rank's queries (2 chunks)
    chunk = local // 2
    q_elements = heads * local * d  # the rank's queries, outputs, their gradients
    backward = attn["gemms"] > 2
    name = attn["name"]

    def kernel(i: int) -> dict:
        if not causal:
            shape = {"seq": local, "causal": 0}
        elif i == 0:  # the diagonal block: the two local chunks under the causal mask
            shape = {"seq": local, "causal": 1}
        else:  # two c × c blocks without a mask
            shape = {"heads": 2 * heads, "seq": chunk, "causal": 0}
        out = {**attn, **shape, "name": f"{name}.cp{i}"}
        out["flops"] = node_flops(out)
        return out

    def pass_over(tag: str, elements: int, inputs: int, precision: str | None = None,
                  flops: float | None = None) -> dict:
        """A memory-bound pass: ``inputs`` tensors of ``elements`` read, one written."""
        out = {"op": "elementwise", "name": f"{name}.{tag}", "phase": attn["phase"],
               "layer": attn["layer"], "precision": precision or attn["precision"],
               "elements": elements, "inputs": inputs, "outputs": 1,
               "flops_per_element": inputs - 1 if flops is None else flops,
               "batch_key": None}
        out["flops"] = node_flops(out)
        return out

    # the off-diagonal steps read the first key / value chunk: made contiguous for the
    # kernel (``k_part.contiguous()``); none without a mask (the whole block is read)
    half = [pass_over("cp_kv_half", kv_elements // 2, 1)] if causal else []
    # the first step copies into its buffers (torch.cat of k and v for the send buffer
    # forward, copy_ into the send buffer backward); later steps add into them
    nodes = [pass_over("cp_kv_buffer", kv_elements, 1)]
    for i in range(cp):
        nodes.append(kernel(i))
        if i:
            nodes += half
        if backward:
            # dq copied, then added, over the whole query (``dq.add_(dq_)``); dk, dv
            # likewise, the later steps' over the chunk they touched
            nodes.append(pass_over("cp_dq", q_elements, 2 if i else 1))
            nodes.append(pass_over("cp_dkv", kv_elements if not i else (
                kv_elements // 2 if causal else kv_elements), 2 if i else 1))
    if not backward:
        # the log-sum-exps (fp32, one per query row and head): step 0's copied, each later
        # step's folded in as its kernel ends (flash_attn_fwd_softmax_lse_correction)
        nodes += [pass_over("cp_lse", heads * local, 2 if i else 1, "fp32",
                            LSE_MERGE_FLOPS if i else 0.0) for i in range(cp)]
        # the merge after the last step: the first partial output rescaled
        # (flash_attn_fwd_out_correction_init), each further one rescaled and added
        nodes += [pass_over("cp_out", q_elements, 2 if i else 1) for i in range(cp)]
    return nodes


def kv_elements(spec, tp: int, cp: int) -> int:
    """Keys and values of one micro-batch on a tensor- and context-parallel rank: its s/cp
    tokens of its query groups (one where there are fewer groups than tp ranks: Megatron
    replicates them)."""
    if spec.multi_latent_attention:  # every head's own keys and values (MLA)
        return spec.micro_batch_size * (spec.seq_length // cp) * spec.kv_width // tp
    groups = -(-spec.query_groups // tp)
    return 2 * spec.micro_batch_size * (spec.seq_length // cp) * groups * spec.head_dim


def ring_comm(cp: int, kv_s: float, kv_dkv_s: float) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's ring transfers: cp−1 of the keys and
    values forward; backward the keys and values, cp−2 of keys, values and their gradients
    together (``kv_dkv_s``), and the gradients alone back to their owner."""
    if cp <= 1:
        return 0.0, 0.0
    return (cp - 1) * kv_s, 2 * kv_s + (cp - 2) * kv_dkv_s


def ring_exposed(cp: int, kv_s: float, kv_dkv_s: float, attention_f: float,
                 attention_b: float) -> tuple[float, float]:
    """(forward, backward) seconds of the ring transfers not behind the attention kernels.

    The steps do equal work (the load balancing's purpose), so each kernel takes 1/cp of
    the pass's attention time.  Forward, step i+1's keys and values travel during step i's
    kernel (cp−1 transfers); backward, each step's transfer during that step's kernel.
    """
    if cp <= 1:
        return 0.0, 0.0
    step_f, step_b = attention_f / cp, attention_b / cp
    forward = (cp - 1) * max(0.0, kv_s - step_f)
    backward = 2 * max(0.0, kv_s - step_b) + (cp - 2) * max(0.0, kv_dkv_s - step_b)
    return forward, backward
