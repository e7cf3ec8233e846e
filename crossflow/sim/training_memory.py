"""The bytes per device of a training iteration (:func:`transformer_memory`): weights,
gradients, optimizer state and activations on the fullest device — the first pipeline stage
(the embedding, the most micro-batches in flight) or the last (the output layer, the loss's
logits, the multi-token-prediction block) — after Korthikanti et al. 2022, and the
per-stage parameter split (:func:`stage_parameter_split`, over the chunks' layers the
parallelism file's ``chunk_split`` gives) that the iteration's time
(:mod:`crossflow.sim.training`) reads too.  Whether those bytes fit is
:mod:`crossflow.sim.memory`'s check.
"""

from __future__ import annotations

from crossflow.arch.microarch import BYTES_PER_ELEMENT
from crossflow.parallel.spec import chunk_layers
from crossflow.workloads.transformer import block_params, kind_params, mtp_params

#: Mixed-precision Adam (Megatron-LM's FP16 optimizer) keeps an fp32 master weight and two
#: fp32 moments per parameter (12 B) beside the fp16 weight (2 B) and gradient (2 B)
#: (Rajbhandari et al., ZeRO, SC20 §3.1: 16 bytes per parameter).  ``GRAD_BYTES`` is what
#: a gradient exchange sends by default (fp16/bf16).
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
#: Megatron accumulates gradients into an fp32 buffer (``main_grad``, for gradient
#: accumulation fusion and ``--accumulate-allreduce-grads-in-fp32``), so a parameter holds
#: 4 gradient bytes: 18 bytes per parameter with mixed precision, not ZeRO's 16
#: (megatron/core/distributed/param_and_grad_buffer.py; Korthikanti et al. 2022's Table 5
#: memory is 6.7 % above ZeRO's count).
MAIN_GRAD_BYTES = 4


def stage_parameters(spec, *, tp: int, pp: int, split: tuple[int, ...] | None = None,
                     vp: int = 1, ep: int = 1, etp: int = 1) -> float:
    """Parameters per device of the first pipeline stage (with the embedding table)."""
    return sum(stage_parameter_split(spec, tp=tp, pp=pp, split=split, vp=vp, ep=ep, etp=etp))


def stage_parameter_split(spec, *, tp: int, pp: int, split: tuple[int, ...] | None = None,
                          vp: int = 1, ep: int = 1, etp: int = 1, stage: int = 0
                          ) -> tuple[float, float]:
    """(parameters split by tensor parallelism, routed experts' parameters split by
    expert × expert tensor parallelism) on a device of pipeline stage ``stage`` (0: the
    first).  Tensor parallelism does not split the experts: expert tensor parallelism
    does (Megatron-Core's expert grid).

    The first stage holds the word embedding (V × h, vocab-parallel); the last the output
    layer — its own weight when untied, else a copy of the embedding's (Megatron-Core's
    ``shared_embedding_or_output_weight``; one tensor when both are on one stage) — and the
    multi-token-prediction block, which embeds its shifted inputs with an embedding of its
    own stage (``GPTModel`` builds one where ``mtp_process``; the output layer's weight
    when tied)."""
    L, h, V = spec.num_layers, spec.hidden_size, spec.vocab_size
    counts = split or chunk_layers(L, pp * vp)
    untied = spec.untie_embeddings_and_output_weights
    tables = 1 if stage == 0 else 0  # V × h tables: the word embedding
    mtp_dense = mtp_expert = 0
    if stage == pp - 1:
        if untied or pp > 1:  # the output layer
            tables += 1
        if untied and pp > 1 and spec.mtp_num_layers:  # the MTP block's embedding
            tables += 1
        mtp_dense, mtp_expert = mtp_params(spec)
    embedding = tables * V * h / tp
    if not spec.moe and spec.hybrid_override_pattern is None:
        own = sum(counts[stage::pp])  # this device's chunks
        return (own * block_params(spec) + mtp_dense) / tp + embedding, 0.0
    kinds = spec.layer_kinds
    params = {kind: kind_params(spec, kind) for kind in set(kinds)}  # a few kinds, many layers
    starts = [sum(counts[:i]) for i in range(len(counts))]
    dense = expert = 0.0
    for c in range(stage, len(counts), pp):
        for kind in kinds[starts[c]:starts[c] + counts[c]]:
            d, e = params[kind]
            dense += d
            expert += e
    return (dense + mtp_dense) / tp + embedding, (expert + mtp_expert) / (ep * etp)


def grad_bytes(software) -> int:
    """Bytes per parameter of the gradient buffer under ``software`` (a SoftwareSpec or
    None: Megatron's fp32 ``main_grad``)."""
    return software.main_grad_bytes if software is not None else MAIN_GRAD_BYTES


def transformer_memory(spec, **options) -> dict[str, float]:
    """Bytes per device of :func:`transformer_iteration` with these options (those of
    :func:`stage_memory`) on its fullest device, without pricing anything (the
    memory-only check of a search, :func:`crossflow.distributed.memory_check`)."""
    return stage_memory(spec, **options)[1]


def stage_memory(spec, *, tp: int, pp: int, dp: int, vp: int = 1, sp: bool = False,
                 schedule: str = "1f1b", zero1: bool = False, fsdp: str = "",
                 grad_bytes: int = MAIN_GRAD_BYTES, cp: int = 1,
                 split: tuple[int, ...] | None = None, ep: int = 1, etp: int = 1
                 ) -> tuple[int, dict[str, float]]:
    """(stage, bytes per device) of the fuller of the first pipeline stage (the embedding,
    the most micro-batches in flight) and the last (the output layer, the loss's logits,
    the multi-token-prediction block); stage 0 when there is one."""
    if vp > 1 and schedule == "1f1b":
        schedule = "interleaved"
    m = spec.global_batch_size // (dp * spec.micro_batch_size)
    counts = split or tuple(chunk_layers(spec.num_layers, pp * vp))
    per_layer = _layer_activations(spec, tp=tp, sp=sp, etp=etp)  # the same on every stage
    kept = per_layer
    if spec.activation_recompute == "full" and (spec.recompute_method == "block"
                                                or (spec.recompute_num_layers or 1) > 1):
        # a layer full recomputation does not rerun keeps all its activations
        kept = _layer_activations(spec.model_copy(update={"activation_recompute": "none"}),
                                  tp=tp, sp=sp, etp=etp)
    stages = (0, pp - 1) if pp > 1 else (0,)
    return max(((r, _stage_bytes(
        spec, tp=tp, pp=pp, dp=dp, vp=vp, sp=sp, zero1=zero1, fsdp=fsdp,
        stage_params=stage_parameter_split(spec, tp=tp, pp=pp, split=counts, vp=vp, ep=ep,
                                           etp=etp, stage=r),
        m=m, schedule=schedule, grad_bytes=grad_bytes, cp=cp, ep=ep, etp=etp,
        per_layer=per_layer, kept=kept, chunks=counts[r::pp], stage=r))
        for r in stages), key=lambda rb: sum(rb[1].values()))


def stage_name(stage: int, pp: int) -> str | None:
    """How a message names the stage :func:`stage_memory` describes: None where there is
    only one."""
    if pp == 1:
        return None
    return "first pipeline stage" if stage == 0 else "last pipeline stage"


def loss_activations(spec, *, tp: int, sp: bool) -> float:
    """Bytes the loss keeps for its backward, per micro-batch on the last stage (a rank's
    share of the sequence before context parallelism divides it): the vocab-parallel logits
    as fp32, 4·s·b·V/t (Megatron-Core's ``vocab_parallel_cross_entropy`` casts them and
    saves their softmax; Transformer Engine's fused cross entropy, which Megatron-Bridge's
    recipes select, saves their gradient in fp32), and the final norm's and the output
    layer's inputs, 2 bytes each per token and hidden unit (/t under sequence
    parallelism); again for each multi-token-prediction depth, which has its own norm,
    logits and loss.  Where one stage holds the whole model, Megatron-LM's
    ``theoretical_memory_usage`` counts the same 4·s·b·(h + V)/t."""
    s, b, h = spec.seq_length, spec.micro_batch_size, spec.hidden_size
    return (1 + spec.mtp_num_layers) * s * b * (4 * spec.vocab_size / tp
                                                 + 4 * h / (tp if sp else 1))


def _hybrid_split(spec, qkv: float, dense_mlp: float, moe_mlp: float) -> float:
    """The bytes per token and hidden unit that tensor parallelism splits, averaged over
    the layers of a hybrid stack: an attention layer's q, k, v and output (as in a block),
    an MLP's or MoE layer's (as in a block), and a Mamba-2 layer's saved tensors — the input
    projection's output (z, x, B, C, dt; mamba_ssm's memory-efficient path recomputes the
    convolution from it), the scan's output and the gated norm's (the output projection's
    input), 2 bytes each."""
    pattern, h = spec.hybrid_override_pattern, spec.hidden_size
    mamba = 2 * (spec.mamba_in_width + 2 * spec.mamba_inner) / h
    return (pattern.count("*") * (2 + qkv) + pattern.count("M") * mamba
            + pattern.count("-") * dense_mlp + pattern.count("E") * moe_mlp) / len(pattern)


def _layer_activations(spec, *, tp: int, sp: bool, etp: int) -> float:
    """Bytes one decoder layer keeps for its backward, per micro-batch (before context
    parallelism divides the sequence), averaged over the model's layers.

    Activations per layer per micro-batch follow Korthikanti et al. 2022 (Table 2):
    s·b·h·(34 + 5·a·s/h) without parallelism; (10 + 24/t + 5·a·s/(h·t)) with tensor
    parallelism; (34/t + 5·a·s/(h·t)) with sequence parallelism; the attention-core term
    5·a·s/(h·t) vanishes when selective recomputation reruns the attention core
    (``core_attn``); full recompute keeps only the layer input
    (2·s·b·h, /t with sequence parallelism).  Selective recomputation's other modules
    free what :func:`_recomputed` says.
    """
    s, b, h, a, L = (spec.seq_length, spec.micro_batch_size, spec.hidden_size,
                     spec.num_attention_heads, spec.num_layers)
    rc = spec.activation_recompute
    # Korthikanti's 34 bytes per token and hidden unit: 10 that tensor parallelism does not
    # split (layernorm inputs, dropout masks) and 24 it does: 16 in the MLP (the fc1 and
    # GeLU outputs, 2·4h each), 6 the q, k, v, 2 the attention output.  A gated MLP keeps
    # its 2·ffn-wide fc1 output and the ffn-wide SwiGLU output; GQA keeps smaller k, v.
    mlp = dense_mlp = moe_mlp = (6 if spec.gated_linear_unit else 4) * spec.ffn / h
    # the elements (per token and hidden unit) of the feed-forward GEMMs' inputs a quantized
    # run saves in the GEMMs' format: a dense MLP's fc2 input; an MoE layer's permuted
    # copies (the experts' fc1 input) and the experts' and the shared expert's fc2 inputs
    quant_dense = quant_moe = spec.ffn / h
    share = k = 0.0
    # the bytes per element a quantized GEMM input saves against bf16, averaged over the
    # layers, those kept in BF16 (first_last_layers_bf16) saving nothing
    shed = 0.0
    if spec.quantized:
        bf16 = spec.bf16_layers
        shed = (2 - BYTES_PER_ELEMENT[spec.precision]) * (1 - sum(bf16) / len(bf16))
    if spec.moe:
        # An MoE layer keeps, per token, its k permuted copies and their expert outputs
        # (2·k·h each) and the experts' fc1 and activation outputs, as a dense MLP of width
        # k·moe_ffn does, plus the shared expert's; averaged over the model's layers.  k
        # counts the copies the experts process: fewer when a capacity drops some, the
        # capacity's when padded.  With expert tensor parallelism the experts' input is the
        # rows the expert-tensor group gathered, etp times a rank's own (their fc1 and
        # activation outputs are 1/etp as wide: the same bytes).  Under latent MoE the
        # copies are latent-wide, and the up-projection keeps its input (the combined
        # latent rows) for its weight gradient
        k = spec.routed_rows(s * b) / (s * b)
        gate = 6 if spec.gated_linear_unit else 4
        wide = spec.moe_width / h
        moe_mlp = (2 * k * (1 + etp) * wide + gate * (k * spec.moe_ffn + spec.shared_ffn) / h
                   + (2 * wide if spec.moe_latent_size else 0))
        quant_moe = k * etp * wide + (k * spec.moe_ffn + spec.shared_ffn) / h
        share = sum(spec.moe_layers) / L
        mlp = share * moe_mlp + (1 - share) * mlp
    # the attention keeps q, k and v; with query and key norms also their input
    qkv = 2 * (spec.qkv_width + spec.qk_norm_width) / h
    if spec.multi_latent_attention:  # and the low-rank latents and their norms' outputs
        kvl, _, rope, _ = spec.mla_dims
        qkv += 2 * (2 * (spec.q_lora_rank or 0) + 2 * kvl + rope) / h
    split = 2 + qkv + mlp
    if spec.hybrid_override_pattern is not None:
        split = _hybrid_split(spec, qkv, dense_mlp, moe_mlp)
    if rc == "full":
        per_layer = 2 * s * b * h / (tp if sp else 1)
    else:
        flash = (spec.attention_backend or "unfused") == "flash"
        # the s×s probabilities (2 bytes), the dropout mask (1) and its output (2); without
        # attention dropout the probabilities alone; none with a flash kernel (it keeps
        # only the softmax statistics) or where selective recomputation reruns the core
        core = "core_attn" in spec.recomputed_modules
        scores = 5 if spec.attention_dropout else 2
        attention = 0.0 if core or flash else scores * a * s / (h * tp)
        # Korthikanti's 10 bytes that tensor parallelism does not split hold the two
        # residual branches' dropout masks, 1 byte each; none without hidden dropout
        unsplit = 10 if spec.hidden_dropout else 8
        if spec.hybrid_override_pattern is not None:  # one norm (and branch) per layer
            attention *= spec.hybrid_override_pattern.count("*") / L
            base = (unsplit / 2 + split) / tp if sp else unsplit / 2 + split / tp
        else:
            base = (unsplit + split) / tp if sp else unsplit + split / tp
        if spec.quantized:
            # Transformer Engine saves the quantized copies of the GEMM inputs it made anyway
            # for the weight gradients: the qkv and fc1 inputs (layernorm outputs) and the
            # fc2 input take 1 byte (FP8) or 0.5625 (NVFP4) instead of 2 (the attention
            # output stays bf16: the flash backward reads it); averaged over the layers,
            # those kept in BF16 (first_last_layers_bf16) saving nothing
            if spec.hybrid_override_pattern is None:
                base -= shed * (2 / tp if sp else 2)
                base -= shed * (share * quant_moe + (1 - share) * quant_dense) / tp
            else:  # one norm-fed GEMM per layer; the feed-forward GEMMs in - and E layers
                pattern = spec.hybrid_override_pattern
                base -= shed * (1 / tp if sp else 1)
                base -= shed * (pattern.count("-") * quant_dense
                                + pattern.count("E") * quant_moe) / L / tp
        if spec.recomputed_modules:
            base -= _recomputed(spec, tp=tp, sp=sp, shed=shed, share=share, k=k,
                                dense_mlp=dense_mlp, moe_mlp=moe_mlp,
                                quant_dense=quant_dense, quant_moe=quant_moe)
        per_layer = s * b * h * (base + attention)
    return per_layer


def _recomputed(spec, *, tp, sp, shed, share, k, dense_mlp, moe_mlp, quant_dense,
                quant_moe) -> float:
    """What selective recomputation's modules other than the attention core free, in
    bytes per token and hidden unit averaged over the layers (as :func:`_layer_activations`
    counts them, ``shed`` the bytes a quantized GEMM input saves): a module rerun in
    backward keeps no output (Megatron-Core discards ``layernorm``'s, ``mla_up_proj``'s and
    ``moe_act``'s outputs once their consumers have run, Transformer Engine then saving the
    GEMMs' original inputs, not quantized copies; ``mlp``, ``moe`` and ``shared_experts``
    checkpoint their input, which the layer keeps anyway).

    * ``layernorm``: the outputs of the norms no linear layer fuses — the pre-MLP norm of
      every layer of an MoE model (of a hybrid stack's MoE layers) and MLA's input norm;
    * ``mlp``: a dense MLP's fc1 and activation outputs and, where fused into fc1, its
      norm's output;
    * ``moe``: everything an MoE layer keeps past its input; else ``moe_act``: the routed
      experts' activation outputs, 2·k·moe_ffn, and ``shared_experts``: the shared expert's;
    * ``mla_up_proj``: the queries, keys and values (the latents stay).
    """
    modules, h = spec.recomputed_modules, spec.hidden_size
    pattern = spec.hybrid_override_pattern
    if pattern is None:
        attention, dense, moe = 1.0, 1 - share, share
    else:
        attention, dense, moe = (pattern.count(c) / len(pattern) for c in "*-E")
    kinds = spec.layer_kinds
    # the share of layers with a pre-MLP norm of their own, and of dense MLPs whose norm is
    # fused into fc1 (an MoE model's dense layers have their own)
    separate = sum(map(spec.separate_pre_mlp_norm, kinds)) / len(kinds)
    fused = 0.0 if spec.separate_pre_mlp_norm("-") else dense
    norms = 0.0
    if "layernorm" in modules:
        norms += separate + attention * spec.multi_latent_attention
    if "mlp" in modules:  # a fused norm's output; a separate one is the checkpoint's input
        norms += fused
    norms *= 2 - shed  # a norm's output, as the norm-fed GEMM keeps it
    split = 0.0
    if "mlp" in modules:
        split += dense * (dense_mlp - shed * quant_dense)
    if "moe" in modules:
        split += moe * (moe_mlp - shed * quant_moe)
    else:
        if "moe_act" in modules:
            split += moe * (2 - shed) * k * spec.moe_ffn / h
        if "shared_experts" in modules:
            gate = 6 if spec.gated_linear_unit else 4
            split += moe * (gate - shed) * spec.shared_ffn / h
    if "mla_up_proj" in modules and spec.multi_latent_attention:
        split += attention * 2 * spec.qkv_width / h
    return norms / (tp if sp else 1) + split / tp


def _stage_bytes(spec, *, tp, pp, dp, vp, sp, zero1, stage_params, m, schedule,
                 per_layer: float, kept: float, chunks: tuple[int, ...], stage: int,
                 grad_bytes=MAIN_GRAD_BYTES, cp=1, ep=1, etp=1, fsdp="") -> dict[str, float]:
    """Bytes on a device of pipeline stage ``stage``, which holds chunks of ``chunks``
    decoder layers of ``per_layer`` activation bytes each per micro-batch
    (:func:`_layer_activations`), or ``kept`` where full recomputation does not rerun a
    layer.

    Full recomputation's block method reruns the first ``recompute_num_layers`` layers of
    each chunk; the others, and the MTP layers, keep all their activations.  Its uniform
    method with groups of n layers keeps one input per group, and while a group is rerun
    its layers' activations for one micro-batch, n − 1 more than the one layer the figure
    leaves out for every full recomputation (as Korthikanti et al. do).

    In-flight micro-batches on the first stage: p with 1F1B, p·(1 + (p−1)/(p·v))
    interleaved (Korthikanti eq. 5), m with GPipe; on stage r, p − r with 1F1B, and
    interleaved the chunk-micro-batches Megatron-Core's schedule runs forward before its
    first backward, 2·(p − r − 1) + (v − 1)·p + 1, over v chunks
    (``get_pp_rank_microbatches``).  The last stage also keeps the loss's inputs for one
    micro-batch (:func:`loss_activations`).
    """
    L = spec.num_layers
    if schedule == "gpipe":
        in_flight = m  # every micro-batch's activations wait for the backward pass
    elif vp > 1:
        in_flight = (2 * (pp - stage - 1) + (vp - 1) * pp + 1) / vp
    else:
        in_flight = min(pp - stage, m)
    # a rank holds 1/cp of each sequence; the MTP layers and the loss are on the last stage,
    # the last chunk, which runs one micro-batch's backward straight after its forward
    layers, extra = sum(chunks), 0.0
    mtp = spec.mtp_num_layers * len(spec.mtp_layer_kinds) if stage == pp - 1 else 0
    if spec.recompute_method == "block":
        rerun = sum(map(spec.recomputed_layers, chunks))
        held = rerun * in_flight
        extra = kept * ((layers - rerun) * in_flight + mtp)
    else:
        n = spec.recompute_num_layers or 1  # > 1 only under the uniform method
        held = (sum(-(-c // n) for c in chunks) if n > 1 else layers) * in_flight + mtp
        if n > 1:
            extra = (min(n, max(chunks)) - 1) * kept
    loss = loss_activations(spec, tp=tp, sp=sp) if stage == pp - 1 else 0.0
    activations = (per_layer * held + extra + loss) / cp
    shard = dp * cp if zero1 else 1
    dense, expert = stage_params
    # the experts' optimizer state is sharded over their own data-parallel ranks
    expert_shard = tp * dp * cp // (ep * etp) if zero1 else 1
    params = dense + expert
    # FP8 (Transformer Engine without FP8 primary weights): the weights stay bf16; their
    # FP8 casts are transient workspaces, not counted
    sharded = dense / shard + expert / expert_shard  # one rank's shard of the parameters
    optimizer = sharded * OPTIMIZER_BYTES
    weights, gradients = params * WEIGHT_BYTES, params * grad_bytes
    # Megatron-FSDP keeps the shards, and two units (layers) whole at a time: its double
    # buffer, one unit in use while the next is gathered or the last reduce-scattered
    units = 2 * params / max(1, L // pp)
    if fsdp in ("optim_grads", "optim_grads_params"):
        gradients = (sharded + units) * grad_bytes
    if fsdp == "optim_grads_params":
        weights = (sharded + units) * WEIGHT_BYTES
    return {
        "weights_bytes": weights,
        "gradients_bytes": gradients,
        "optimizer_state_bytes": optimizer,
        "activations_bytes": activations,
    }
