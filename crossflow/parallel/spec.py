"""The parallelism file (docs/architecture.md, "Config kinds"): a paper strategy name or
Megatron's degrees.

Either ``strategy: RC-4-2-d3-p2`` (paper §3.3; see :data:`~crossflow.parallel.strategy.GRAMMAR`)
or the Megatron-LM keys::

    tensor_parallel: 8
    pipeline_parallel: 8
    data_parallel: 24
    virtual_pipeline_stages: 1
    sequence_parallel: false

``kind: parallelism`` may be left out.  Execution options that are not part of the grid go
here too: the pipeline ``schedule`` (1F1B, interleaved when virtual stages > 1, or GPipe),
``zero1`` (optimizer state sharded over the data-parallel group, Rajbhandari et al. 2020,
stage 1; Megatron's name ``use_distributed_optimizer`` is accepted as its alias), a
``micro_batch_size``, a ``recompute_granularity`` (Megatron's name: none, selective or
full), ``recompute_modules``, ``recompute_method`` and ``recompute_num_layers`` that
override the workload's, and Megatron-FSDP
(``use_megatron_fsdp`` with its ``data_parallel_sharding_strategy``: ZeRO-1, -2 or -3 over
the data × context ranks), and how the layers split over the pipeline chunks where not
evenly (Megatron's ``account_for_*_in_pipeline_split``,
``num_layers_in_first/last_pipeline_stage`` or a ``pipeline_model_parallel_layout``:
:meth:`ParallelismSpec.chunk_split`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import Field, model_validator

from crossflow.config.base import Spec
from crossflow.config.loader import load_spec, register_kind
from crossflow.errors import ConfigError
from crossflow.parallel.strategy import Strategy

Degree = Annotated[int, Field(ge=1)]

#: Megatron key -> Strategy field
MEGATRON_KEYS = {
    "tensor_parallel": "kp1",
    "pipeline_parallel": "lp",
    "data_parallel": "dp",
    "virtual_pipeline_stages": "vp",
    "sequence_parallel": "sp",
}


class ParallelismSpec(Spec):
    kind: Literal["parallelism"] = "parallelism"
    name: str = "parallelism"
    #: a paper strategy name, e.g. "RC-4-2-d3-p2"; excludes the Megatron degree keys
    strategy: str | None = None
    tensor_parallel: Degree = 1
    pipeline_parallel: Degree = 1
    data_parallel: Degree = 1
    virtual_pipeline_stages: Degree = 1
    sequence_parallel: bool = False
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    #: shard optimizer state over the data-parallel group (ZeRO stage 1)
    zero1: bool = False
    #: overrides the workload's micro_batch_size (transformers)
    micro_batch_size: Degree | None = None
    #: reduce each layer's gradients while the backward pass goes on (PyTorch DDP buckets);
    #: Megatron-LM of SC21 / Korthikanti et al. did not
    overlap_grad_reduce: bool = False
    #: Megatron's ``--recompute-granularity`` (none / selective / full): overrides the
    #: workload's ``activation_recompute`` (None: the workload's)
    recompute_granularity: Literal["none", "selective", "full"] | None = None
    #: Megatron's ``--recompute-modules``: under selective recomputation, the modules
    #: recomputed (the workload's ``recompute_modules``, which this overrides; None: the
    #: workload's)
    recompute_modules: tuple[str, ...] | None = None
    #: Megatron's ``--recompute-method`` and ``--recompute-num-layers`` under full
    #: recomputation (the workload's keys, which these override; None: the workload's)
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: Degree | None = None
    #: Megatron's ``--use-distributed-optimizer``: another name for ``zero1``
    use_distributed_optimizer: bool | None = None
    #: context parallelism (Megatron's ``--context-parallel-size``): each sequence split over
    #: this many devices, keys and values passed around a ring during attention.  The devices
    #: are tensor × context × data × pipeline; in the strategy's grid the context ranks sit
    #: in the data-parallel dimension (Megatron orders them tp-cp-dp-pp), so ``data_parallel``
    #: stays the number of model replicas; with a strategy name its ``d`` is data × context
    context_parallel: Degree = 1
    #: expert parallelism (Megatron's ``--expert-model-parallel-size``): the routed experts of
    #: each MoE layer are split over this many ranks, tokens exchanged by all-to-alls.  Not a
    #: dimension of the grid: as Megatron-Core's MoE parallel folding does, the expert layers
    #: have their own grid, expert-tensor × expert × expert-data parallel (tensor fastest),
    #: over the ranks of a pipeline stage numbered tensor-fastest, then data × context; so
    #: expert_tensor_parallel × expert_parallel must divide tensor × data × context
    #: (checked against the workload: it must divide num_moe_experts too)
    expert_parallel: Degree = 1
    #: expert tensor parallelism (Megatron's ``--expert-tensor-parallel-size``): each routed
    #: expert's GEMMs split this many ways (fc1 column-, fc2 row-parallel), the tokens
    #: gathered over the group before the experts and reduce-scattered after.  An
    #: expert-tensor group is this many consecutive ranks of the expert grid, an expert group
    #: takes one rank of each.  Megatron-Core's own default (unset) is tensor_parallel; this
    #: one is 1, each expert whole on one rank: what Megatron-Bridge's MoE recipes set
    #: (``expert_tensor_parallel_size = 1`` in NVIDIA-NeMo/Megatron-Bridge
    #: src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py, …/deepseek/h100/deepseek_v3.py,
    #: …/gpt_oss/h100/gpt_oss.py), so what the published MoE rows ran, and what predictions
    #: assumed before this key.  Give it the tensor_parallel degree for Megatron-Core's default
    expert_tensor_parallel: Degree = 1
    #: Megatron-Core's uneven pipeline split: the embedding (the loss) counts as one layer
    #: when the layers are cut into pipeline × virtual chunks, so the first (last) chunk has
    #: one layer fewer; (num_layers + the accounted ones) must divide evenly
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    #: Megatron-Core's uneven first and last pipeline stages
    #: (``--num-layers-in-first-pipeline-stage``, ``--num-layers-in-last-pipeline-stage``):
    #: that stage holds this many layers (split over its virtual chunks), the other stages
    #: share the rest evenly
    num_layers_in_first_pipeline_stage: Annotated[int, Field(ge=0)] | None = None
    num_layers_in_last_pipeline_stage: Annotated[int, Field(ge=0)] | None = None
    #: Megatron-LM's ``--pipeline-model-parallel-layout``: each model chunk's layers, chunks
    #: in layer order separated by ``|`` — ``E`` the embedding, ``t`` a decoder layer, ``m``
    #: a multi-token-prediction depth, ``L`` the loss; ``(…)*n`` and ``x*n`` repeat, commas
    #: are cosmetic (DeepSeek-V3's recipe on 8 × 4 chunks: ``Et|(tt|)*30mL``).  The MTP
    #: depths sit with the loss (:func:`parse_pipeline_layout`)
    pipeline_model_parallel_layout: str | None = None
    #: Megatron's ``--use-megatron-fsdp``: the data-parallel (× context) ranks run
    #: Megatron-FSDP, which shards what ``data_parallel_sharding_strategy`` names
    use_megatron_fsdp: bool = False
    #: Megatron's ``--data-parallel-sharding-strategy`` (only with use_megatron_fsdp; its
    #: default is Megatron's): ``no_shard`` (DDP), ``optim`` (ZeRO-1, as the distributed
    #: optimizer), ``optim_grads`` (ZeRO-2: each micro-batch's gradients reduce-scattered
    #: during its backward pass), ``optim_grads_params`` (ZeRO-3: the parameters sharded
    #: too, each layer's all-gathered before its forward and again before its backward)
    data_parallel_sharding_strategy: Literal[
        "no_shard", "optim", "optim_grads", "optim_grads_params"] = "optim_grads_params"

    @property
    def uneven_pipeline(self) -> bool:
        """Whether the layers are split over the pipeline chunks otherwise than evenly."""
        return (self.pipeline_model_parallel_layout is not None
                or self.num_layers_in_first_pipeline_stage is not None
                or self.num_layers_in_last_pipeline_stage is not None
                or self.account_for_embedding_in_pipeline_split
                or self.account_for_loss_in_pipeline_split)

    def chunk_split(self, num_layers: int) -> tuple[int, ...] | None:
        """Decoder layers of each model chunk, in layer order (chunk c on pipeline stage
        c mod pipeline_parallel), as Megatron-Core's ``get_num_layers_to_build`` builds
        them; None for the even split.  A ConfigError names the key whose split cannot hold
        ``num_layers``."""
        if not self.uneven_pipeline:
            return None
        strategy = self.to_strategy()
        pp, vp = strategy.pp, strategy.vp
        if self.pipeline_model_parallel_layout is not None:
            return parse_pipeline_layout(self.pipeline_model_parallel_layout).decoder
        first, last = (self.num_layers_in_first_pipeline_stage,
                       self.num_layers_in_last_pipeline_stage)
        if first is None and last is None:  # the embedding / loss take a layer's slot
            extra = (int(self.account_for_embedding_in_pipeline_split),
                     int(self.account_for_loss_in_pipeline_split))
            total = num_layers + sum(extra)
            if total % (pp * vp):
                raise ConfigError(
                    f"num_layers ({num_layers}) and the {sum(extra)} accounted slots, "
                    f"{total}, must divide evenly over pipeline_parallel × "
                    f"virtual_pipeline_stages = {pp * vp} chunks",
                    key=("account_for_embedding_in_pipeline_split" if extra[0] else
                         "account_for_loss_in_pipeline_split"), value=True,
                    allowed=f"false, or a model of a multiple of {pp * vp} layers less "
                    f"{sum(extra)}")
            return tuple(chunk_layers(num_layers, pp * vp, extra))
        return self._uneven_stages(num_layers, pp, vp)

    def _uneven_stages(self, num_layers: int, pp: int, vp: int) -> tuple[int, ...]:
        """Megatron-Core's split with ``num_layers_in_first/last_pipeline_stage``."""
        ends = {0: self.num_layers_in_first_pipeline_stage,
                pp - 1: self.num_layers_in_last_pipeline_stage}
        keys = {0: "num_layers_in_first_pipeline_stage",
                pp - 1: "num_layers_in_last_pipeline_stage"}
        given = {stage: n for stage, n in ends.items() if n is not None}
        left, stages = num_layers - sum(given.values()), pp - len(given)
        key = keys[max(given)]
        if left < 0 or (stages and left % stages) or (not stages and left):
            raise ConfigError(
                f"with {num_layers} layers on {pp} pipeline stages, the {left} layers the "
                f"uneven stages leave must split evenly over the other {stages}",
                key=key, value=given[max(given)],
                allowed="a count that leaves the other stages a multiple of their number")
        per_stage = {stage: given.get(stage, left // stages if stages else 0)
                     for stage in range(pp)}
        odd = sorted(stage for stage, n in per_stage.items() if n % vp)
        if odd:
            stage = next((st for st in odd if st in given), odd[0])
            key = keys[stage] if stage in given else key
            raise ConfigError(
                f"pipeline stage {stage} holds {per_stage[stage]} layers, which its "
                f"{vp} virtual chunks must share evenly (Megatron-Core's "
                "get_num_layers_to_build)", key=key, value=getattr(self, key),
                allowed=f"a multiple of virtual_pipeline_stages ({vp}) per stage")
        return tuple(per_stage[c % pp] // vp for c in range(pp * vp))

    @property
    def sharded_optimizer(self) -> bool:
        """Whether the optimizer state is sharded (``zero1``, its alias, or Megatron-FSDP's
        sharding of it)."""
        return self.zero1 or bool(self.use_distributed_optimizer) or bool(self.fsdp)

    @property
    def fsdp(self) -> str:
        """What Megatron-FSDP shards beyond DDP: its sharding strategy, or "" (off, or
        ``no_shard``)."""
        strategy = self.data_parallel_sharding_strategy
        return strategy if self.use_megatron_fsdp and strategy != "no_shard" else ""

    @model_validator(mode="before")
    @classmethod
    def _degrees_in_the_name(cls, data):
        """A strategy name may carry the degrees of :data:`OPTIONS_GRAMMAR` (``-c2``,
        ``-e8``, ``-et2``), in a file as on the command line: they become their keys."""
        name = data.get("strategy") if isinstance(data, dict) else None
        if not isinstance(name, str) or not _OPTIONS.search(name):
            return data
        fields = _name_fields(name, None)
        clash = sorted(k for k in fields if k != "strategy" and data.get(k, fields[k])
                       != fields[k])
        if clash:
            raise ConfigError(f"the strategy name gives {', '.join(clash)} other than the "
                              "key does", key="strategy", value=name,
                              allowed="a degree given once, in the name or as its key")
        return {**data, **fields}

    @model_validator(mode="after")
    def _consistent(self) -> ParallelismSpec:
        if self.context_parallel > 1 and self.strategy is not None:
            self._check_context_parallel()
        if self.expert_parallel > 1 or self.expert_tensor_parallel > 1:
            self._check_expert_parallel()
        if (self.use_distributed_optimizer is not None and "zero1" in self.model_fields_set
                and self.zero1 != self.use_distributed_optimizer):
            raise ConfigError("use_distributed_optimizer is another name for zero1; give "
                              "one of them, or both alike", key="use_distributed_optimizer",
                              value=self.use_distributed_optimizer,
                              allowed=f"{self.zero1} (as zero1)")
        if self.strategy is not None:
            both = sorted(set(MEGATRON_KEYS) & self.model_fields_set)
            if both:
                raise ConfigError(
                    f"give either 'strategy' or the Megatron degrees, not both (also "
                    f"given: {', '.join(both)})", key="strategy", value=self.strategy)
        if ("data_parallel_sharding_strategy" in self.model_fields_set
                and not self.use_megatron_fsdp):
            raise ConfigError("the sharding strategy is Megatron-FSDP's: it acts only with "
                              "use_megatron_fsdp: true (use_distributed_optimizer alone "
                              "shards the optimizer state)",
                              key="data_parallel_sharding_strategy",
                              value=self.data_parallel_sharding_strategy,
                              allowed="use_megatron_fsdp: true beside it, or no such key")
        if self.pipeline_model_parallel_layout is not None:
            self._check_layout()
        uneven = [k for k in ("num_layers_in_first_pipeline_stage",
                              "num_layers_in_last_pipeline_stage") if getattr(self, k) is not None]
        accounted = [k for k in ("account_for_embedding_in_pipeline_split",
                                 "account_for_loss_in_pipeline_split") if getattr(self, k)]
        if uneven and accounted:
            raise ConfigError(
                f"Megatron-Core does not split with both {uneven[0]} and {accounted[0]} "
                "(get_num_layers_to_build asserts)", key=uneven[0], value=getattr(self, uneven[0]),
                allowed=f"unset, or {accounted[0]}: false")
        if self.virtual_pipeline_stages > 1 and self.schedule != "1f1b":
            raise ConfigError("interleaved virtual stages run the 1F1B schedule (SC21 "
                              "§2.2.2)", key="virtual_pipeline_stages",
                              value=self.virtual_pipeline_stages, allowed="schedule: 1f1b")
        self.to_strategy()
        return self

    def _check_layout(self) -> None:
        key, layout = "pipeline_model_parallel_layout", self.pipeline_model_parallel_layout
        accounted = [k for k in ("account_for_embedding_in_pipeline_split",
                                 "account_for_loss_in_pipeline_split") if getattr(self, k)] + [
            k for k in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")
            if getattr(self, k) is not None]
        if accounted:
            raise ConfigError(
                f"the layout places every layer itself; {accounted[0]} is Megatron's other "
                "way of splitting", key=key, value=layout,
                allowed="the layout alone, or the account_for_* / num_layers_in_* keys")
        chunks = len(parse_pipeline_layout(layout).decoder)
        strategy = self.to_strategy()
        if chunks != strategy.pp * strategy.vp:
            raise ConfigError(
                f"the layout has {chunks} model chunks (| separates them) for "
                f"pipeline_parallel × virtual_pipeline_stages = {strategy.pp} × "
                f"{strategy.vp} (Megatron-Core: its length must divide by the pipeline size, "
                "the quotient being the virtual stages)", key=key, value=layout,
                allowed=f"{strategy.pp * strategy.vp} chunks")

    def _check_context_parallel(self) -> None:
        """With a strategy name (a search's design), the grid's d is data × context: the
        context ranks are taken from it, so cp must divide it (Megatron's tensor
        parallelism only: the paper's kernel parallelism splits no sequence)."""
        strategy = Strategy.parse(self.strategy)
        if strategy.kp_type != "TP" or strategy.dp % self.context_parallel:
            raise ConfigError(
                f"with a strategy name, context parallelism takes the ranks of its data "
                f"dimension (Megatron's tp-cp-dp-pp order), so its degree must divide the "
                f"strategy's d ({self.strategy!r}: {strategy.kp_type}, d = {strategy.dp})",
                key="context_parallel", value=self.context_parallel,
                allowed=f"a divisor of {strategy.dp}" if strategy.kp_type == "TP" else "1")

    def _check_expert_parallel(self) -> None:
        """Megatron-Core's expert grid (parallel_state.initialize_model_parallel) takes the
        ranks of a pipeline stage: world size must divide by expert-tensor × expert ×
        pipeline parallel (its RuntimeError), so etp × ep must divide tensor × data ×
        context; any such etp is accepted (no other assertion on it)."""
        strategy = self.to_strategy()
        key = "expert_parallel" if self.expert_parallel > 1 else "expert_tensor_parallel"
        if strategy.kp_type != "TP":
            raise ConfigError("expert parallelism goes with Megatron's tensor parallelism, not "
                              f"the paper's {strategy.kp_type} kernel parallelism",
                              key=key, value=getattr(self, key),
                              allowed="1 with an RC / CR strategy")
        ranks = strategy.tp * strategy.dp  # the grid's d is data × context
        etp, ep = self.expert_tensor_parallel, self.expert_parallel
        shown = (f"tensor_parallel × data_parallel × context_parallel = "
                 f"{self.tensor_parallel} × {self.data_parallel} × "
                 f"{self.context_parallel} = {ranks}" if self.strategy is None else
                 f"tensor × data parallel of {self.strategy} = {ranks}")
        if ranks % ep:
            raise ConfigError(
                f"an expert-parallel group is expert_parallel ranks of a pipeline stage, "
                f"whose {shown} ranks it must divide (Megatron-Core's MoE parallel folding)",
                key="expert_parallel", value=ep, allowed=f"a divisor of {ranks}")
        if ranks % (etp * ep):
            fits = [d for d in range(1, ranks // ep + 1) if ranks // ep % d == 0]
            raise ConfigError(
                f"the expert layers' grid, expert_tensor_parallel × expert_parallel × "
                f"expert-data parallel, takes the {shown} ranks of a pipeline stage, so "
                f"expert_tensor_parallel × expert_parallel ({etp} × {ep} = {etp * ep}) must "
                f"divide {ranks} (Megatron-Core's parallel_state refuses a world size that "
                f"expert-tensor × expert × pipeline parallel does not divide)",
                key="expert_tensor_parallel", value=etp,
                allowed=f"with expert_parallel {ep}, a divisor of {ranks // ep}: "
                        f"{', '.join(map(str, fits))}")

    def to_strategy(self) -> Strategy:
        """The :class:`Strategy` this file describes."""
        if self.strategy is not None:
            return Strategy.parse(self.strategy)
        try:
            return Strategy.megatron(
                tp=self.tensor_parallel, pp=self.pipeline_parallel,
                dp=self.data_parallel * self.context_parallel,
                vp=self.virtual_pipeline_stages, sp=self.sequence_parallel,
            )
        except ConfigError as exc:
            key = next(k for k, f in MEGATRON_KEYS.items() if f == exc.key)
            raise ConfigError(exc.problem, key=key, value=getattr(self, key)) from None


#: The degrees a strategy name may carry besides its grid, as Megatron-LM's short names:
#: ``-c2`` context, ``-e8`` expert, ``-et2`` expert-tensor parallelism
_OPTIONS = re.compile(r"(?i)(?:^|-)(et|e|c)([0-9]+)(?=-|$)")
_OPTION_KEYS = {"c": "context_parallel", "e": "expert_parallel",
                "et": "expert_tensor_parallel"}
OPTIONS_GRAMMAR = ("-c{cp} (context parallelism: d counts data × context ranks), -e{ep} "
                   "(expert parallelism) and -et{etp} (expert tensor parallelism), e.g. "
                   "t2-d64-p8-v4-sp-e64")


def parse_parallelism(source) -> ParallelismSpec:
    """A ParallelismSpec from a spec, a preset name, a file or a mapping — or a bare strategy
    name such as ``RC-4-2-d32-p2`` or ``t8-d24-p8`` (paper / Megatron names), with
    :data:`OPTIONS_GRAMMAR`'s degrees optionally (``t8-d16-p4-sp-c2``), or an inline YAML
    mapping of a parallelism file's keys (``{strategy: t8-d8-sp-e16,
    use_distributed_optimizer: true}``; its strategy may carry the same degrees).  The one
    reader of a parallelism reference (predictions and study files)."""
    if isinstance(source, ParallelismSpec):
        return source
    if isinstance(source, str) and source.lstrip().startswith("{"):
        from crossflow.config.base import parse_yaml

        mapping = parse_yaml(source, key="parallelism")
        return load_spec({"kind": "parallelism", **mapping}, "parallelism")
    try:
        return load_spec(source, "parallelism")
    except ConfigError as not_a_preset:
        if (not isinstance(source, str) or source.endswith((".yaml", ".yml"))
                or not_a_preset.file):  # a file was found and read: its error is the one
            raise
        return load_spec({"kind": "parallelism", **_name_fields(source, not_a_preset)},
                         "parallelism")


def _name_fields(source: str, not_a_preset: ConfigError | None) -> dict:
    """The parallelism keys a strategy name gives: ``strategy`` (its grid) and the degrees
    of :data:`OPTIONS_GRAMMAR` it carries."""
    found = [(_OPTION_KEYS[k.lower()], int(v)) for k, v in _OPTIONS.findall(source)]
    options = dict(found)
    if len(options) < len(found):
        raise ConfigError("a degree is given twice", key="parallelism", value=source,
                          allowed=f"each of {OPTIONS_GRAMMAR} at most once") from None
    grid = _OPTIONS.sub("", source).strip("-")
    try:
        Strategy.parse(grid)
    except ConfigError as bad:
        if not_a_preset is None:
            raise ConfigError("not a strategy name", key="strategy", value=source,
                              allowed=f"a strategy: {bad.allowed}; then optionally "
                                      f"{OPTIONS_GRAMMAR}") from None
        raise ConfigError(
            "neither a parallelism preset, a file, nor a strategy name",
            key="parallelism", value=source,
            allowed=f"{not_a_preset.allowed}; or a strategy: {bad.allowed}; then "
                    f"optionally {OPTIONS_GRAMMAR}, or an inline mapping such as "
                    "'{strategy: t8-d8-sp, use_distributed_optimizer: true}'",
        ) from None
    return {"strategy": grid, **options}


# Parallelism files (kind may be left out: loader.DEFAULT_KINDS) validate here.
register_kind("parallelism", "parallelism", ParallelismSpec)


@dataclass(frozen=True)
class PipelineLayout:
    """A parsed ``pipeline_model_parallel_layout``: decoder layers per chunk (layer order)
    and MTP depths (all in the last chunk, beside the loss)."""

    decoder: tuple[int, ...]
    mtp: int


_REPEAT = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))
LAYOUT_GRAMMAR = ("chunks in layer order separated by |, each of E (embedding, first), t "
                  "(decoder layer), m (MTP depth, in the last chunk), L (loss, last); (…)*n "
                  "and x*n repeat, e.g. Et|(tt|)*30mL")


@lru_cache(maxsize=64)
def parse_pipeline_layout(layout: str) -> PipelineLayout:
    """Megatron-LM's layout string (``PipelineParallelLayerLayout.parse_str_to_list``: commas
    dropped, ``(…)*n`` then ``x*n`` unrolled, ``|`` between chunks), checked as its
    ``validate_layer_layout`` does — the embedding first, the loss last, once each — and
    the MTP depths in the last chunk, where CrossFlow prices them."""
    key = "pipeline_model_parallel_layout"
    text = layout.replace(",", "")
    for pattern in _REPEAT:
        text = pattern.sub(lambda m: m.group(1) * int(m.group(2)), text)
    chunks = text.split("|")
    odd = sorted(set(text) - set("EtmL|"))
    flat = "".join(chunks)
    if odd or not flat:
        raise ConfigError(f"{', '.join(map(repr, odd)) or 'nothing'} is no layer of a layout",
                          key=key, value=layout, allowed=LAYOUT_GRAMMAR)
    if flat[0] != "E" or flat[-1] != "L" or flat.count("E") != 1 or flat.count("L") != 1:
        raise ConfigError("the embedding comes first and the loss last, once each "
                          "(Megatron-Core's validate_layer_layout)", key=key, value=layout,
                          allowed=LAYOUT_GRAMMAR)
    if "m" in "".join(chunks[:-1]):
        raise ConfigError("CrossFlow prices the MTP depths on the last chunk, beside the "
                          "loss (Megatron-Core's placement without a layout)", key=key,
                          value=layout, allowed="every m in the last chunk")
    return PipelineLayout(tuple(c.count("t") for c in chunks), flat.count("m"))


def chunk_layers(L: int, chunks: int, extra_layers: tuple[int, int] = (0, 0)) -> list[int]:
    """Layers of each pipeline chunk, first to last: an even split, or Megatron-Core's
    uneven one where the embedding (loss) takes a layer's slot in the first (last) chunk."""
    first, last = extra_layers
    per = (L + first + last) // chunks
    layers = [per] * chunks
    layers[0] -= first
    layers[-1] -= last
    return layers
