"""Workload specs (docs/architecture.md, "Config kinds").

A GEMM is ``{kind: gemm, m, k, n, precision}``: C[m, n] = A[m, k] · B[k, n].  A transformer
uses Megatron-LM's names (num_layers, hidden_size, …), the LSTM the same names where they
mean the same thing.  How a workload runs on many devices is a separate parallelism file
(``kind: parallelism``, validated by the parallel layer).

(Over 600 lines, one module on purpose: :class:`TransformerSpec`'s fields are Megatron-LM's
arguments, each with the comment that says what the model does with it, and its properties
derive the widths the graph and the memory model read from them; split, a key would live
apart from what it means.)
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from crossflow.config.base import Spec
from crossflow.config.device import Precision
from crossflow.config.megatron_options import check_options
from crossflow.errors import ConfigError

Dim = Annotated[int, Field(ge=1)]


class GemmSpec(Spec):
    kind: Literal["gemm"]
    name: str = "gemm"
    m: Dim
    k: Dim
    n: Dim
    precision: Precision = "fp16"
    #: how many identical GEMMs run one after another (e.g. a batched matmul's batch)
    count: Dim = 1


Recompute = Literal["none", "selective", "full"]

#: Megatron-Core's other ``--attention-backend`` names (``AttnBackend``) as the kernels priced
#: here: ``fused`` (Transformer Engine's cuDNN fused attention) is a fused tiled kernel like
#: ``flash``; ``local`` (Megatron's own core) is unfused; ``auto`` (Transformer Engine picks)
#: is what the system's software profile runs
ATTENTION_BACKENDS = {"fused": "flash", "local": "unfused", "auto": None}


def _divides(spec: Spec, part: str, whole: str, what: str = "") -> None:
    """Raise a ConfigError naming ``part`` unless spec.part divides spec.whole."""
    p, w = getattr(spec, part), getattr(spec, whole)
    if w % p:
        raise ConfigError(f"must divide {whole} ({w}){what}", key=part, value=p)


class TransformerSpec(Spec):
    """A GPT-style decoder-only transformer in the Megatron-LM layout (keys:
    docs/architecture.md, "Config kinds").

    Narayanan et al., SC21 (arXiv:2104.04473) and Korthikanti et al., MLSys 2023
    (arXiv:2205.05198).  ``global_batch_size`` counts sequences per iteration;
    ``micro_batch_size`` sequences go through the pipeline at a time.
    """

    kind: Literal["transformer"]
    name: str = "transformer"
    num_layers: Dim
    hidden_size: Dim
    num_attention_heads: Dim
    seq_length: Dim
    vocab_size: Dim
    global_batch_size: Dim
    micro_batch_size: Dim = 1
    precision: Precision = "fp16"
    activation_recompute: Recompute = "none"
    #: under ``activation_recompute: selective``, the modules recomputed in backward
    #: (Megatron-Core's ``--recompute-modules``; their choices:
    #: :data:`crossflow.config.megatron_options.RECOMPUTE_MODULES`); None: Megatron's
    #: default, ``[core_attn]``
    recompute_modules: tuple[str, ...] | None = None
    #: under ``activation_recompute: full``, which layers (Megatron's ``--recompute-method``):
    #: ``uniform`` checkpoints the input of each group of ``recompute_num_layers`` layers and
    #: recomputes every layer; ``block`` recomputes the first ``recompute_num_layers`` layers
    #: of each pipeline chunk and keeps the others' activations.  None: uniform, groups of 1
    recompute_method: Literal["uniform", "block"] | None = None
    #: Megatron's ``--recompute-num-layers`` (uniform: default 1; block: required)
    recompute_num_layers: Dim | None = None
    #: the MLP's inner width; Megatron's default is 4 · hidden_size
    ffn_hidden_size: Dim | None = None
    #: key/value heads (Megatron's ``--num-query-groups``): grouped-query attention when
    #: fewer than the heads, multi-query with 1; None: one per head (multi-head attention)
    num_query_groups: Dim | None = None
    #: width of one attention head (Megatron's ``--kv-channels``); None: hidden / heads
    kv_channels: Dim | None = None
    #: a gated MLP (Megatron's ``--swiglu``: SwiGLU, Llama): the first MLP GEMM produces
    #: the gate and the up projection (2·ffn wide), so the MLP is three h×ffn GEMMs
    gated_linear_unit: bool = False
    #: a separate output-layer weight instead of the word embedding's (Llama); no
    #: embedding-gradient exchange between the first and last pipeline stage
    untie_embeddings_and_output_weights: bool = False
    #: learned absolute position embeddings (GPT-3), rotary embeddings applied to q and k
    #: (Llama, Nemotron), or none (Mamba-based hybrids: the mixers carry the positions);
    #: Megatron's ``--position-embedding-type``
    position_embedding_type: Literal["learned_absolute", "rope", "none"] = "learned_absolute"
    #: the norm layers (Megatron's ``--normalization``): ``LayerNorm`` (a weight and a bias
    #: per norm) or ``RMSNorm`` (a weight; Llama, Qwen, DeepSeek, Mixtral).  Both kernels
    #: read and write the same bytes and cost the same time; RMSNorm's hold half the weights
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    #: a bias in the attention's and the dense MLP's linear layers (Megatron's
    #: ``add_bias_linear``, default true; ``--disable-bias-linear`` in Llama, Qwen, Mixtral):
    #: the biases' weights and gradients.  MoE experts and MLA never have biases here
    add_bias_linear: bool = True
    #: dropout probabilities (Megatron's ``--hidden-dropout`` on the residual branches and
    #: the embedding, ``--attention-dropout`` after the unfused core's softmax; default 0.1,
    #: 0 in today's recipes): at 0 no dropout mask is kept and no dropout kernel runs
    hidden_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1
    attention_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1
    #: a norm on each head's queries and keys before the rotary embedding (Megatron's
    #: ``--qk-layernorm``; Qwen3, OLMo 2, Gemma 3): Transformer Engine's norm kernel over
    #: rows of one head's width, forward and backward, its input kept for the backward.
    #: Multi-head latent attention always has its latent norms, and this adds nothing there
    qk_layernorm: bool = False
    #: the attention kernel (Megatron's ``--attention-backend``): ``unfused`` (two batched
    #: GEMMs with the s×s scores in memory and a softmax kernel, Megatron-LM 2021-22) or
    #: ``flash`` (one fused, tiled kernel, FlashAttention / cuDNN: no s×s tensor in memory);
    #: None: the system's software profile decides (``software.attention``), else unfused.
    #: Megatron's other names are read as these (:data:`ATTENTION_BACKENDS`)
    attention_backend: Literal["unfused", "flash", "fused", "local", "auto"] | None = None
    #: causal (decoder) attention: a flash kernel skips the masked half of the scores
    causal: bool = True
    #: sliding-window attention (``--window-size``): the keys (left, right) of each query a
    #: windowed layer sees, -1 unlimited; which layers (``--window-attn-skip-freq``): N, all
    #: but every N-th; a list of 1 (window) and 0 per layer; None, all (attention_window.py)
    window_size: tuple[int, int] | None = None
    window_attn_skip_freq: Dim | tuple[int, ...] | None = None
    #: Mixture of experts (Megatron-Core's MoE layer; docs/model.md, "Mixture of experts"):
    #: routed experts per MoE layer (``--num-experts``); None: a dense model
    num_moe_experts: Dim | None = None
    #: experts each token is routed to (``--moe-router-topk``; Megatron's default 2)
    moe_router_topk: Dim = 2
    #: inner width of one routed expert (``--moe-ffn-hidden-size``); None: ffn_hidden_size.
    #: Experts take the MLP's activation: gated (SwiGLU) when ``gated_linear_unit``
    moe_ffn_hidden_size: Dim | None = None
    #: inner width of the shared expert every token also goes through
    #: (``--moe-shared-expert-intermediate-size``); None: no shared expert
    moe_shared_expert_intermediate_size: Dim | None = None
    #: latent MoE (``--moe-latent-size``; Nemotron 3 Super): the routed experts work in a
    #: latent space of this width — each MoE layer projects a token down to it before the
    #: dispatch and back up after the combine (two h × latent GEMMs, not split by tensor
    #: parallelism), so the all-to-alls and the experts' GEMMs carry the latent width
    #: instead of hidden_size; the router and the shared expert see the full width.  None:
    #: the experts take the hidden state itself
    moe_latent_size: Dim | None = None
    #: which layers are MoE (``--moe-layer-freq``), Megatron's semantics: an int N makes
    #: layer i (from 0) an MoE layer when i % N == 0 (1: every layer); a list of 0 / 1, one
    #: per layer, gives the pattern (DeepSeek-V3's first three dense layers: [0, 0, 0, 1, …])
    moe_layer_freq: Dim | tuple[Annotated[int, Field(ge=0, le=1)], ...] = 1
    #: multi-head latent attention (``--multi-latent-attention``, DeepSeek-V2/V3; docs/model.md,
    #: "Multi-head latent attention"): queries and keys / values through low-rank projections,
    #: a decoupled rotary part of the keys shared by the heads; num_query_groups and
    #: kv_channels do not apply
    multi_latent_attention: bool = False
    #: MLA: rank of the query compression (``--q-lora-rank``); None: the queries are
    #: projected from the hidden state directly (Megatron-Core's ``linear_q_proj``)
    q_lora_rank: Dim | None = None
    #: MLA: rank of the key / value compression (``--kv-lora-rank``; Megatron's default 512)
    kv_lora_rank: Dim | None = None
    #: MLA: per-head width of the queries and keys without rotary embedding
    #: (``--qk-head-dim``; default 128)
    qk_head_dim: Dim | None = None
    #: MLA: per-head width of their rotary part (``--qk-pos-emb-head-dim``; default 64)
    qk_pos_emb_head_dim: Dim | None = None
    #: MLA: per-head width of the values (``--v-head-dim``; default 128)
    v_head_dim: Dim | None = None
    #: token dropping (``--moe-expert-capacity-factor``): each expert takes at most
    #: ceil(factor · tokens · topk / experts) of a rank's routed tokens (Megatron-Core's
    #: ``get_capacity``), the rest are dropped; None: dropless
    moe_expert_capacity_factor: float | None = None
    #: with a capacity factor, pad every expert's input up to its capacity
    #: (``--moe-pad-expert-input-to-capacity``): each expert's GEMMs and the all-to-alls
    #: carry exactly the capacity, however the router spread the tokens
    moe_pad_expert_input_to_capacity: bool = False
    #: how tokens reach the experts of other ranks (``--moe-token-dispatcher-type``):
    #: ``alltoall`` sends every routed copy (token, expert) to its expert's rank;
    #: ``flex`` (DeepEP, HybridEP) sends a token once to each rank that holds one of its
    #: experts, and across nodes once to each node, forwarded inside it over NVLink
    moe_token_dispatcher_type: Literal["alltoall", "flex"] = "alltoall"
    #: CUDA graphs (``--cuda-graph-impl``): ``none``, per-layer graphs of the modules
    #: ``cuda_graph_modules`` names (``local``, ``transformer_engine``; [] the whole layer),
    #: or one graph of the whole forward-backward, the optimizer step outside
    #: (``full_iteration``; docs/model.md, "CUDA graphs and overlapped expert all-to-alls")
    cuda_graph_impl: Literal["none", "local", "transformer_engine", "full_iteration"] = "none"
    #: ``--cuda-graph-modules``: attn, mlp, moe, moe_router, moe_preprocess, mamba
    cuda_graph_modules: tuple[str, ...] = ()
    #: one micro-batch's MoE all-to-alls behind another's computation
    #: (``--overlap-moe-expert-parallel-comm``, with ``--delay-wgrad-compute``)
    overlap_moe_expert_parallel_comm: bool = False
    #: the attention core in FP8 (``--fp8-dot-product-attention``, cuDNN's FP8 attention)
    fp8_dot_product_attention: bool = False
    #: a hybrid stack (Megatron-LM's ``--hybrid-override-pattern``; Mamba-based models such
    #: as Nemotron-H): one symbol per layer, each a layer of its own with a pre-norm and a
    #: residual — ``M`` a Mamba-2 mixer, ``*`` self-attention, ``-`` an MLP, ``E`` an MoE
    #: layer; None: every layer is attention followed by an MLP (or MoE, ``moe_layer_freq``)
    hybrid_override_pattern: str | None = None
    #: Mamba-2 (``--mamba-state-dim``, ``--mamba-head-dim``, ``--mamba-num-groups``,
    #: ``--mamba-num-heads``; Megatron-Core's MambaMixer): the SSM state per head, the
    #: width of a head, the groups sharing B and C; heads None: 2 · hidden_size / head
    #: width (the mixer's expand of 2)
    mamba_state_dim: Dim = 128
    mamba_head_dim: Dim = 64
    mamba_num_groups: Dim = 8
    mamba_num_heads: Dim | None = None
    #: keep the first and last layers of a quantized run (fp8, fp4) in BF16
    #: (``--first-last-layers-bf16``; Megatron-Bridge's NVFP4 recipe for Nemotron 3 Super
    #: keeps its last 14): ``num_layers_at_start_in_bf16`` and ``num_layers_at_end_in_bf16``
    #: of them (Megatron's defaults 1 and 1; a hybrid stack counts each symbol a layer)
    first_last_layers_bf16: bool = False
    num_layers_at_start_in_bf16: Annotated[int, Field(ge=0)] = 1
    num_layers_at_end_in_bf16: Annotated[int, Field(ge=0)] = 1
    #: multi-token prediction (``--mtp-num-layers``; DeepSeek-V3, Nemotron 3): after the
    #: decoder, each of ``mtp_num_layers`` depths embeds the inputs shifted once more,
    #: normalises them and the previous depth's hidden states, projects their concatenation
    #: (2h -> h), runs one MTP layer and the shared output head and loss; on the last
    #: pipeline stage (Megatron-Core's placement without a pipeline layout).  0: none
    mtp_num_layers: Annotated[int, Field(ge=0)] = 0
    #: one MTP layer's parameters for every depth (``mtp_use_repeated_layer``; the depths
    #: still run one after another)
    mtp_use_repeated_layer: bool = False
    #: the layers of one MTP depth in a hybrid stack, as symbols of
    #: ``hybrid_override_pattern`` (``mtp_hybrid_override_pattern``; Nemotron 3's "*E");
    #: a GPT model's MTP layer is a layer of the decoder's last kind
    mtp_hybrid_override_pattern: str | None = None

    @property
    def bf16_layers(self) -> tuple[bool, ...]:
        """Per layer (from 0), whether it runs in BF16 in a quantized run
        (``first_last_layers_bf16``; Megatron-Core's ``get_fp8_context`` /
        ``get_fp4_context``): all False otherwise."""
        L = self.num_layers
        if not (self.quantized and self.first_last_layers_bf16):
            return (False,) * L
        start, end = self.num_layers_at_start_in_bf16, self.num_layers_at_end_in_bf16
        return tuple(i < start or i >= L - end for i in range(L))

    @property
    def mtp_layer_kinds(self) -> tuple[str, ...]:
        """The layers of one MTP depth, as :attr:`layer_kinds` names them (empty without
        MTP): a hybrid stack's ``mtp_hybrid_override_pattern``, or one layer of the
        decoder's last kind (Megatron-Core builds the MTP layer from the last layer's
        spec)."""
        if not self.mtp_num_layers:
            return ()
        if self.hybrid_override_pattern is not None:
            return tuple(self.mtp_hybrid_override_pattern)
        return self.layer_kinds[-1:]

    @property
    def ffn(self) -> int:
        """The MLP's inner width (``ffn_hidden_size``, default 4h)."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        """``kv_channels``, default hidden / heads; with MLA, the values' width per head."""
        if self.multi_latent_attention:
            return self.mla_dims[3]
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def mla_dims(self) -> tuple[int, int, int, int]:
        """MLA's (kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim), unset ones at
        Megatron-Core's MLATransformerConfig defaults (512, 128, 64, 128)."""
        return (self.kv_lora_rank or 512, self.qk_head_dim or 128,
                self.qk_pos_emb_head_dim or 64, self.v_head_dim or 128)

    @property
    def qk_dim(self) -> int:
        """Per-head width of the queries and keys in the attention scores (head_dim; with
        MLA qk_head_dim + qk_pos_emb_head_dim)."""
        if self.multi_latent_attention:
            return self.mla_dims[1] + self.mla_dims[2]
        return self.head_dim

    @property
    def kv_width(self) -> int:
        """Elements of one token's keys and values as the attention kernel reads them."""
        if self.multi_latent_attention:
            return self.num_attention_heads * (self.qk_dim + self.head_dim)
        return 2 * self.query_groups * self.head_dim

    @property
    def query_groups(self) -> int:
        """Key/value heads (``num_query_groups``, default the attention heads)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def q_width(self) -> int:
        """Width of the queries (and of the attention output): heads × head_dim."""
        return self.num_attention_heads * self.head_dim

    @property
    def qkv_width(self) -> int:
        """Output width of the QKV projection: queries plus one key and one value per
        query group (with MLA: the queries, keys and values the attention reads)."""
        if self.multi_latent_attention:
            return self.num_attention_heads * self.qk_dim + self.kv_width
        return (self.num_attention_heads + 2 * self.query_groups) * self.head_dim

    def _norm_params(self, width: int) -> int:
        """Weights of one norm over ``width`` elements: LayerNorm's weight and bias, or
        RMSNorm's weight."""
        return (2 if self.normalization == "LayerNorm" else 1) * width

    @property
    def norm_params(self) -> int:
        """Weights of one norm over the hidden width."""
        return self._norm_params(self.hidden_size)

    @property
    def qk_norm_params(self) -> int:
        """Weights of the query norm and the key norm (``qk_layernorm``), each over one
        head's width; 0 without them."""
        return 2 * self._norm_params(self.head_dim) if self.qk_norm_width else 0

    @property
    def linear_bias(self) -> int:
        """1 where the attention's and the dense MLP's linear layers have biases, else 0."""
        return int(self.add_bias_linear)

    @property
    def qk_norm_width(self) -> int:
        """Elements per token the query and key norms normalise (``qk_layernorm``): every
        query head's and key group's head_dim; 0 without them, and under MLA, whose latent
        norms are its own nodes."""
        if not self.qk_layernorm or self.multi_latent_attention:
            return 0
        return (self.num_attention_heads + self.query_groups) * self.head_dim

    @property
    def attention_macs(self) -> int:
        """Multiply-adds per token of the attention's linear layers (the QKV projection, or
        MLA's five, and the output projection)."""
        h, a = self.hidden_size, self.num_attention_heads
        if self.multi_latent_attention:
            ql, (kvl, nope, rope, v) = self.q_lora_rank, self.mla_dims
            query = (h * ql + ql * a * (nope + rope)) if ql else h * a * (nope + rope)
            return query + h * (kvl + rope) + kvl * a * (nope + v) + a * v * h
        return h * self.qkv_width + self.q_width * h

    @property
    def mlp_in_width(self) -> int:
        """Output width of the first MLP GEMM (2·ffn when gated)."""
        return (2 if self.gated_linear_unit else 1) * self.ffn

    @property
    def moe(self) -> bool:
        """Whether the model has MoE layers."""
        return self.num_moe_experts is not None and any(self.moe_layers)

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """Per layer (from 0), what it holds, as symbols of ``hybrid_override_pattern``:
        ``*-`` attention and an MLP, ``*E`` attention and an MoE layer, or one symbol of a
        hybrid stack (``M``, ``*``, ``-``, ``E``)."""
        if self.hybrid_override_pattern is not None:
            return tuple(self.hybrid_override_pattern)
        return tuple("*E" if moe else "*-" for moe in self.moe_layers)

    @property
    def mamba_heads(self) -> int:
        """Mamba-2 heads (``mamba_num_heads``, default 2 · hidden_size / mamba_head_dim)."""
        return self.mamba_num_heads or 2 * self.hidden_size // self.mamba_head_dim

    @property
    def mamba_inner(self) -> int:
        """The Mamba-2 mixer's inner width (d_inner = heads × head width)."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_conv_width(self) -> int:
        """Channels of the mixer's causal convolution: x, B and C (d_inner + 2·groups·state)."""
        return self.mamba_inner + 2 * self.mamba_num_groups * self.mamba_state_dim

    @property
    def mamba_in_width(self) -> int:
        """Output width of the mixer's input projection: z, x, B, C and dt."""
        return self.mamba_inner + self.mamba_conv_width + self.mamba_heads

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        """Per layer (from 0), whether it is an MoE layer (all False for a dense model)."""
        if self.hybrid_override_pattern is not None:
            return tuple(c == "E" for c in self.hybrid_override_pattern)
        if self.num_moe_experts is None:
            return (False,) * self.num_layers
        if isinstance(self.moe_layer_freq, int):
            return tuple(i % self.moe_layer_freq == 0 for i in range(self.num_layers))
        return tuple(bool(x) for x in self.moe_layer_freq)

    @property
    def moe_ffn(self) -> int:
        """Inner width of one routed expert."""
        return self.moe_ffn_hidden_size or self.ffn

    @property
    def moe_width(self) -> int:
        """Width of the tokens the routed experts take and give back: moe_latent_size
        under latent MoE, else hidden_size."""
        return self.moe_latent_size or self.hidden_size

    @property
    def moe_in_width(self) -> int:
        """Output width of an expert's first GEMM (2·moe_ffn when gated)."""
        return (2 if self.gated_linear_unit else 1) * self.moe_ffn

    @property
    def moe_macs(self) -> int:
        """Multiply-accumulates per token of one MoE layer's feed-forward part: the router
        (h × experts), the ``topk`` active experts at :attr:`moe_width`, a latent MoE's two
        h × latent projections and the shared expert."""
        h, w = self.hidden_size, self.moe_width
        gated = 2 if self.gated_linear_unit else 1
        latent = 2 * h * w if self.moe_latent_size else 0
        return (h * (self.num_moe_experts or 0)
                + self.moe_router_topk * (w * self.moe_in_width + self.moe_ffn * w)
                + latent + (gated + 1) * h * self.shared_ffn)

    @property
    def shared_ffn(self) -> int:
        """Inner width of the shared expert (0: none)."""
        return self.moe_shared_expert_intermediate_size or 0

    def routed_rows(self, tokens: int) -> int:
        """Token copies the experts of one MoE layer process for ``tokens`` tokens, with
        the router spreading them evenly (the published runs force the balance): each
        token's ``topk`` copies when dropless; with a capacity factor, each expert's share
        t·k/E up to its capacity (Megatron-Core's ``get_capacity``: ceil(t·k/E · factor),
        at most t, one copy of every token), or the capacity itself when padded."""
        k, E = self.moe_router_topk, self.num_moe_experts or 1
        cf = self.moe_expert_capacity_factor
        if cf is None:
            return tokens * k
        capacity = min(math.ceil(tokens * k / E * cf), tokens)
        if self.moe_pad_expert_input_to_capacity:
            return E * capacity
        return min(tokens * k, E * capacity)

    @property
    def quantized(self) -> bool:
        """Whether Transformer Engine runs the Linear layers' GEMMs in a quantized format
        (``fp8``; ``fp4``, its NVFP4 recipe) from casts of their bf16 inputs."""
        return self.precision in ("fp8", "fp4")

    @property
    def activation_precision(self) -> str:
        """Precision of activations, memory-bound ops and communication: with ``fp8`` or
        ``fp4`` only the GEMMs run quantized (Transformer Engine); the rest stays bf16."""
        return "bf16" if self.quantized else self.precision

    @property
    def recomputed_modules(self) -> frozenset[str]:
        """The modules a backward recomputes: ``recompute_modules`` (default ``core_attn``)
        under selective recomputation, none otherwise (full recomputation reruns the whole
        layer)."""
        if self.activation_recompute != "selective":
            return frozenset()
        return frozenset(("core_attn",) if self.recompute_modules is None
                         else self.recompute_modules)

    def separate_pre_mlp_norm(self, kind: str) -> bool:
        """Whether a layer of ``kind`` (:attr:`layer_kinds`) normalises its MLP or MoE
        part's input in a norm of its own rather than in fc1's fused one: Megatron-Core's
        layer spec gives every layer of a model with experts one (the router reads its
        output), a hybrid stack its MoE layers only."""
        return "E" in kind or self.moe and self.hybrid_override_pattern is None

    def recomputed_layers(self, chunk: int) -> int:
        """Of a pipeline chunk of ``chunk`` decoder layers, how many a backward recomputes
        whole: all under full recomputation, the first ``recompute_num_layers`` under its
        block method, none otherwise."""
        if self.activation_recompute != "full":
            return 0
        if self.recompute_method == "block":
            return min(chunk, self.recompute_num_layers)
        return chunk

    @field_validator("attention_backend")
    @classmethod
    def _megatron_backend(cls, value: str | None) -> str | None:
        return ATTENTION_BACKENDS.get(value, value)

    @model_validator(mode="after")
    def _mtp_fits(self) -> TransformerSpec:
        pattern, key = self.mtp_hybrid_override_pattern, "mtp_hybrid_override_pattern"
        if self.hybrid_override_pattern is None:
            if pattern is not None:
                raise ConfigError(
                    "an MTP pattern names the layers of a hybrid stack's MTP depth; this "
                    "model has no hybrid_override_pattern (its MTP layer is a layer of the "
                    "decoder's last kind)", key=key, value=pattern,
                    allowed="null, or set hybrid_override_pattern")
            return self
        if self.mtp_num_layers and not pattern:
            raise ConfigError(
                "a hybrid stack's MTP depth needs its layers (Megatron-LM refuses a hybrid "
                "model with --mtp-num-layers but no MTP pattern)", key=key, value=pattern,
                allowed='symbols of hybrid_override_pattern, e.g. "*E" (Nemotron 3)')
        odd = sorted(set(pattern or "") - set(HYBRID_SYMBOLS))
        if odd:
            raise ConfigError(
                f"{', '.join(repr(c) for c in odd)} is no layer symbol", key=key,
                value=pattern, allowed="M (Mamba-2), * (attention), - (MLP), E (MoE)")
        if "E" in (pattern or "") and self.num_moe_experts is None:
            raise ConfigError(
                "an E layer is an MoE layer, and the model has no experts", key=key,
                value=pattern, allowed="M, * or - layers, or set num_moe_experts")
        return self

    @model_validator(mode="after")
    def _shapes_fit(self) -> TransformerSpec:
        mla_keys = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                    "v_head_dim")
        if self.multi_latent_attention:
            for key in ("num_query_groups", "kv_channels"):
                if getattr(self, key) is not None:
                    raise ConfigError(
                        "multi-head latent attention has no query groups or kv_channels: "
                        "its widths are q_lora_rank, kv_lora_rank, qk_head_dim, "
                        "qk_pos_emb_head_dim and v_head_dim", key=key,
                        value=getattr(self, key),
                        allowed="unset (null) with multi_latent_attention: true")
        else:
            for key in mla_keys:
                if getattr(self, key) is not None:
                    raise ConfigError(
                        "a width of multi-head latent attention, which this model does not "
                        "use (multi_latent_attention is false)", key=key,
                        value=getattr(self, key),
                        allowed="unset, or multi_latent_attention: true")
        if self.kv_channels is None and not self.multi_latent_attention:
            _divides(self, "num_attention_heads", "hidden_size")
        if self.num_query_groups is not None:
            _divides(self, "num_query_groups", "num_attention_heads")
        _divides(self, "micro_batch_size", "global_batch_size")
        if self.moe_expert_capacity_factor is not None and not (
                math.isfinite(self.moe_expert_capacity_factor)
                and self.moe_expert_capacity_factor > 0):
            raise ConfigError(
                "must be a finite number > 0: it scales each expert's even share of the "
                "routed tokens into its capacity",
                key="moe_expert_capacity_factor", value=self.moe_expert_capacity_factor,
                allowed="a number > 0 (1.0: each expert's even share), or null for dropless "
                "routing")
        if self.moe_pad_expert_input_to_capacity and self.moe_expert_capacity_factor is None:
            raise ConfigError(
                "padding each expert's input to its capacity needs a capacity "
                "(moe_expert_capacity_factor; Megatron-Core asserts the same)",
                key="moe_pad_expert_input_to_capacity", value=True,
                allowed="false, or true with moe_expert_capacity_factor set")
        if self.num_moe_experts is None and self.moe_latent_size is not None:
            raise ConfigError(
                "a latent space is where the routed experts of MoE layers work, and the "
                "model has none (num_moe_experts is not set)", key="moe_latent_size",
                value=self.moe_latent_size,
                allowed="null for a dense model, or set num_moe_experts")
        if self.num_moe_experts is None and (self.moe_expert_capacity_factor is not None):
            raise ConfigError(
                "a capacity factor applies to the routed experts of MoE layers, and the "
                "model has none (num_moe_experts is not set)",
                key="moe_expert_capacity_factor", value=self.moe_expert_capacity_factor,
                allowed="null for a dense model, or set num_moe_experts")
        if self.hybrid_override_pattern is not None:
            self._hybrid_fits()
        if self.num_moe_experts is not None:
            if self.moe_router_topk > self.num_moe_experts:
                raise ConfigError(
                    f"a token is routed to at most num_moe_experts "
                    f"({self.num_moe_experts}) experts", key="moe_router_topk",
                    value=self.moe_router_topk,
                    allowed=f"an integer from 1 to {self.num_moe_experts}")
            if (not isinstance(self.moe_layer_freq, int)
                    and len(self.moe_layer_freq) != self.num_layers):
                raise ConfigError(
                    f"a list moe_layer_freq gives one 0 / 1 per layer, but it has "
                    f"{len(self.moe_layer_freq)} entries for num_layers "
                    f"({self.num_layers})", key="moe_layer_freq",
                    value=list(self.moe_layer_freq),
                    allowed=f"an integer N >= 1 (every N-th layer) or {self.num_layers} "
                    "zeros and ones")
        return self

    def _hybrid_fits(self) -> None:
        pattern = self.hybrid_override_pattern
        key = "hybrid_override_pattern"
        odd = sorted(set(pattern) - set(HYBRID_SYMBOLS))
        if odd or not pattern:
            raise ConfigError(
                "a hybrid stack gives one symbol per layer" + (
                    f"; {', '.join(repr(c) for c in odd)} is none of them" if odd else ""),
                key=key, value=pattern,
                allowed="M (Mamba-2), * (attention), - (MLP), E (MoE), e.g. M-M*- (not "
                "Megatron-LM's | pipeline or / multi-token-prediction separators: the "
                "pipeline splits the layers evenly, and an MTP depth's layers are "
                "mtp_num_layers and mtp_hybrid_override_pattern)")
        if len(pattern) != self.num_layers:
            raise ConfigError(
                f"one symbol per layer, but {len(pattern)} symbols for num_layers "
                f"({self.num_layers}) (Megatron-LM counts every Mamba, attention, MLP and MoE "
                f"layer as one)", key=key, value=pattern,
                allowed=f"{self.num_layers} symbols, or num_layers: {len(pattern)}")
        if ("E" in pattern) != (self.num_moe_experts is not None):
            raise ConfigError(
                "an E layer is an MoE layer: it needs num_moe_experts, and num_moe_experts "
                "needs an E layer in the pattern", key=key, value=pattern,
                allowed="E in the pattern with num_moe_experts set, or neither")
        if self.moe_layer_freq != 1:
            raise ConfigError(
                "the hybrid pattern places the MoE layers (its E symbols)",
                key="moe_layer_freq", value=self.moe_layer_freq,
                allowed="unset with hybrid_override_pattern")
        heads, groups = self.mamba_heads, self.mamba_num_groups
        if "M" in pattern and heads % groups:
            raise ConfigError(
                f"the Mamba-2 heads ({heads}) are split evenly into the groups that share B "
                f"and C", key="mamba_num_groups", value=groups,
                allowed=f"a divisor of {heads}")

    @model_validator(mode="after")
    def _options_fit(self) -> TransformerSpec:
        # last: the checks read layer_kinds, which the shape checks above vouch for
        check_options(self)
        return self


#: The layer symbols of ``hybrid_override_pattern`` (Megatron-LM's
#: megatron/core/ssm/mamba_hybrid_layer_allocation.py): Mamba-2, attention, MLP, MoE
HYBRID_SYMBOLS = ("M", "*", "-", "E")


class LstmSpec(Spec):
    """The paper's LSTM language model (§9; DeepFlow's LSTM mode, ARCHITECTURE.md §5).

    ``num_layers`` stacked LSTM layers of width ``hidden_size`` (the embedding width too, no
    projection), unrolled over ``seq_length`` time steps, then a vocabulary projection and
    softmax at every step.  ``global_batch_size`` sequences per iteration.
    """

    kind: Literal["lstm"]
    name: str = "lstm"
    global_batch_size: Dim
    hidden_size: Dim
    vocab_size: Dim
    num_layers: Dim
    seq_length: Dim
    #: input, forget, cell and output gates
    num_gates: Dim = 4
    precision: Precision = "fp16"
    #: ``per_step``: the paper's formulation, every GEMM step by step; ``cudnn``: what
    #: cuDNN's LSTM runs, the input half of the cell GEMM, its weight gradient and the
    #: projection batched over all time steps (docs/model.md)
    implementation: Literal["per_step", "cudnn"] = "per_step"
