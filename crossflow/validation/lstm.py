"""The paper's LSTM language model trained on a GPU, against ``crossflow.predict``.

* ``gpu/torch_lstm_*.csv``: training iterations timed by ``gpu/measure_torch_lstm.py`` on the
  preset its header names.  The ``cudnn`` rows (``torch.nn.LSTM``) are checked against the
  workload with ``implementation: cudnn``, the formulation that runs what cuDNN runs; the
  step-by-step eager rows are recorded beside them (host-bound: docs/validation.md).
"""

from __future__ import annotations

from crossflow.predict import predict
from crossflow.validation.dataset import DataSet, Row, measurements_dir, read_preset_measurements

#: Tolerances: the DeepFlow paper reports 16 % mean error for its LSTM on a V100 (§8); one row
#: of six (batch 64, hidden 1024: 4.8 ms) is bound by the host's kernel dispatch.
LSTM_MAX_MAPE, LSTM_MIN_SPEARMAN = 0.20, 0.9


def workload(r: dict[str, str]) -> dict[str, object]:
    """The measured model as a CrossFlow workload (cuDNN's formulation)."""
    return {"kind": "lstm", "name": f"lstm-b{r['batch']}-h{r['hidden']}",
            "global_batch_size": int(r["batch"]), "hidden_size": int(r["hidden"]),
            "vocab_size": int(r["vocab"]), "num_layers": int(r["layers"]),
            "seq_length": int(r["seq"]), "precision": r["dtype"], "implementation": "cudnn"}


def lstm_datasets() -> list[DataSet]:
    sets = []
    for path in sorted(measurements_dir().glob("gpu/torch_lstm_*.csv")):
        preset, rows = read_preset_measurements(path)
        out = [Row(f"batch {r['batch']} hidden {r['hidden']} ({r['layers']} layers, "
                   f"{r['seq']} steps, vocab {r['vocab']})",
                   predict(workload(r), preset).time_s, float(r["median_s"]))
               for r in rows if r["impl"] == "cudnn"]
        sets.append(DataSet(
            name=f"training: the paper's LSTM LM, torch cuDNN on GPU ({path.stem})",
            source=f"{path.relative_to(measurements_dir())} on preset {preset}, "
                   "implementation: cudnn",
            quantity="time_s", rows=tuple(out),
            max_mape=LSTM_MAX_MAPE, min_spearman=LSTM_MIN_SPEARMAN))
    return sets
