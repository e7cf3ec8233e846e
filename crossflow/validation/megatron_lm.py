"""Megatron-LM's own H100 weak-scaling table (its README, Megatron-Core r0.8.0, BF16):
``megatron_lm_h100_weak_scaling.csv``, nine GPT models of 1.7B-462B parameters on 48-6144
H100s, per-GPU TFLOP/s by Megatron-LM's own FLOP count.

The runs go through Megatron-LM's ``pretrain_gpt.py`` loop, not NeMo / Megatron-Bridge's,
so they are predicted on ``dgx-h100-megatron-lm``: the NeMo-fitted H100 profile with
Megatron-LM's fp32 gradients and its own per-iteration tail, one constant fitted here to
the four rows without pipeline parallelism (their 0.45-0.89 s iterations are where a tail
tells); the five pipelined rows are held out.

What the table does not state is taken as follows, one rule for every row: the micro-batch
by SC21 Table 1's rule (:func:`crossflow.validation.training.sc21_micro_batch`: the
per-replica batch, up to 8, without pipelining; 1 with it), no interleaving (none is
stated; with SC21's interleaving rule the 177B and 314B rows come out 14 and 10 % too
fast), no recomputation (every row fits in memory without it), sequence parallelism with
tensor parallelism, the distributed optimizer, the models' GPT blocks (a GELU MLP of 4h,
one key and value head per query head) with untied embeddings (their published parameter
counts need them: 1.7B is 1.21B in blocks and 2 x 0.27B of embeddings) and flash attention.
"""

from __future__ import annotations

from functools import cache

import numpy as np

import crossflow
from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.validation.dataset import DataSet, Row, measurements_dir, read_measurements
from crossflow.validation.fitting import golden
from crossflow.validation.training import sc21_micro_batch

FILE = "megatron_lm_h100_weak_scaling.csv"
SYSTEM = "dgx-h100-megatron-lm"
#: the NeMo / Megatron-Bridge profile the Megatron-LM one is built from
NEMO_SYSTEM = "dgx-h100-megatron-core"
SEQ_LENGTH, VOCAB = 4096, 131072  # the file's header (the README's benchmark configuration)
#: tolerance of both halves: the training data sets' 10 %
MAX_MAPE = 0.10


@cache
def rows() -> tuple[dict[str, str], ...]:
    return tuple(read_measurements(measurements_dir() / FILE)[1])


def case(r: dict[str, str]) -> tuple[TransformerSpec, dict]:
    """(TransformerSpec, parallelism) of one row under the module's rules."""
    tp, pp, dp = int(r["tensor_parallel"]), int(r["pipeline_parallel"]), int(r["data_parallel"])
    batch = int(r["global_batch_size"])
    spec = TransformerSpec(
        kind="transformer", name=f"gpt-{r['model_size']}", num_layers=int(r["num_layers"]),
        hidden_size=int(r["hidden_size"]), num_attention_heads=int(r["attention_heads"]),
        seq_length=SEQ_LENGTH, vocab_size=VOCAB, global_batch_size=batch,
        micro_batch_size=sc21_micro_batch(pp, batch // dp), precision="bf16",
        activation_recompute="none", untie_embeddings_and_output_weights=True,
        attention_backend="flash")
    par = {"tensor_parallel": tp, "pipeline_parallel": pp, "data_parallel": dp,
           "sequence_parallel": tp > 1, "use_distributed_optimizer": True}
    return spec, par


def predict_row(r: dict[str, str], system=SYSTEM) -> float:
    """Predicted per-GPU TFLOP/s, by the file's FLOP count (Megatron-LM's own)."""
    spec, par = case(r)
    p = crossflow.predict(workload=spec, system=system, parallelism=par)
    if not p.feasible:
        raise ValueError(f"{r['model_size']}: {p.reason}")
    return float(r["derived_flops_per_iter"]) / (p.time_s * int(r["num_gpus"])) / 1e12


def fit_rows() -> tuple[dict[str, str], ...]:
    """The rows the tail is fitted to: those without pipeline parallelism."""
    return tuple(r for r in rows() if int(r["pipeline_parallel"]) == 1)


def held_out_rows() -> tuple[dict[str, str], ...]:
    return tuple(r for r in rows() if int(r["pipeline_parallel"]) > 1)


def label(r: dict[str, str]) -> str:
    spec, par = case(r)
    return (f"{r['model_size']} t{par['tensor_parallel']} p{par['pipeline_parallel']} "
            f"d{par['data_parallel']} mb{spec.micro_batch_size} gb{spec.global_batch_size}")


def dataset(held_out: bool = False, system=SYSTEM) -> DataSet:
    """The rows without pipeline parallelism (the tail's fit data) or the pipelined ones
    (held out), predicted on ``system``."""
    chosen = held_out_rows() if held_out else fit_rows()
    out = tuple(Row(label(r), predict_row(r, system), float(r["tflops_per_gpu"]))
                for r in chosen)
    what = ("pipelined rows (held out)" if held_out
            else "rows without pipelining (fit data of the iteration tail)")
    return DataSet(
        name=f"training: Megatron-LM README, H100 weak scaling (Megatron-Core r0.8.0, BF16), "
             f"{what}",
        source=f"{FILE} on system {system if isinstance(system, str) else system.name} "
               "(unstated settings: crossflow/validation/megatron_lm.py)",
        quantity="TFLOP/s per GPU", rows=out, max_mape=MAX_MAPE, min_spearman=0.0)


def datasets() -> list[DataSet]:
    return [dataset(), dataset(held_out=True)]


def with_tail(seconds: float, base=None):
    """``dgx-h100-megatron-lm`` with its per-iteration tail set to ``seconds``."""
    return (base or load_spec(SYSTEM, "systems")).with_software_fields(iteration_s=seconds)


def fit_tail() -> float:
    """The per-iteration tail that fits :func:`fit_rows` best (golden-section search on
    their mean squared relative TFLOP/s error)."""
    def loss(seconds: float) -> float:
        system = with_tail(seconds)
        return float(np.mean([(predict_row(r, system) / float(r["tflops_per_gpu"]) - 1) ** 2
                              for r in fit_rows()]))

    return golden(loss, 0.0, 0.5)


def print_fit() -> None:
    """Re-fit and print (``python -m crossflow.validation.megatron_lm``): the tail, both
    halves on the shipped profile, and every row on the NeMo profile it is built from."""
    print(f"iteration tail: {fit_tail() * 1e3:.1f} ms (shipped: "
          f"{load_spec(SYSTEM, 'systems').software.iteration_s * 1e3:.1f} ms)")
    for ds in datasets():
        print(ds.render())
    errors = [predict_row(r, NEMO_SYSTEM) / float(r["tflops_per_gpu"]) - 1 for r in rows()]
    print(f"the same rows on {NEMO_SYSTEM} (NeMo's tail, bf16 gradients): MAPE "
          f"{100 * np.mean(np.abs(errors)):.1f}%")
    for r, e in zip(rows(), errors, strict=True):
        print(f"   {label(r):32s} {100 * e:+6.1f}%")

if __name__ == "__main__":  # pragma: no cover - the module's documented command
    print_fit()
