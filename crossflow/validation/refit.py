"""``crossflow calibrate software``: re-fit every software-stack constant from the shipped
measurements and print them in the form the system presets hold (docs/software-stack.md).

Each fit is also a module of its own:

* ``python -m crossflow.validation.collectives vidur [a100|h100]`` — network constants of
  ``vidur-{a100,h100}-dgx`` (Vidur's all-reduce and send/recv, 2 KiB–64 MiB);
* ``python -m crossflow.validation.ops [a100|h100]`` — the PyTorch-eager kernel profile of
  those systems (Vidur's per-op times);
* ``python -m crossflow.validation.vtrain`` — the host constants of
  ``dgx-a100-megatron-deepspeed`` (vTrain's 2-GPU rows; the 4-GPU rows held out);
* ``python -m crossflow.validation.training`` — ``dgx-a100``'s two efficiencies
  (Korthikanti et al. Table 4) and ``dgx-a100-sc21``'s factor (SC21 Table 2);
* ``python -m crossflow.validation.megatron_bridge [moe|blackwell]`` — the
  ``dgx-h100-megatron-core`` profile (the published dense H100 runs), its two MoE
  constants, and the Blackwell profiles' factor (the GB200 dense runs);
* ``python -m crossflow.validation.megatron_lm`` — ``dgx-h100-megatron-lm``'s iteration tail
  (Megatron-LM's README H100 weak-scaling table, its rows without pipelining).

The fits print; they never write the presets (a person reads the numbers, then edits the
YAML with its sources beside each constant).
"""

from __future__ import annotations

from crossflow.validation import collectives, megatron_bridge, megatron_lm, ops, training, vtrain


def refit_all() -> None:  # pragma: no cover - minutes of fitting; each part is tested alone
    for gpu in collectives.VIDUR:
        collectives._print_vidur_fit(gpu)
    for gpu in ops.SYSTEMS:
        ops._print_fit(gpu)
    vtrain._main([])
    training.print_fits()
    for what in ("", "moe", "blackwell"):
        megatron_bridge.print_fit(what)
    megatron_lm.print_fit()
