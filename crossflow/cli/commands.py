"""The handlers of the commands other than ``study`` (:mod:`crossflow.cli.study`): each
``_cmd_*`` imports what it needs when it runs (so ``crossflow predict`` never loads Optuna,
MLflow or matplotlib) and returns the exit status."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from crossflow.cli.parser import _subcommands
from crossflow.cli.status import EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_OK, EXIT_TOLERANCE
from crossflow.errors import ConfigError, one_paragraph


def _cmd_help(parser: argparse.ArgumentParser, topic: Sequence[str]) -> int:
    """``crossflow help [COMMAND [SUB-COMMAND]]``: that parser's --help."""
    for i, word in enumerate(topic):
        commands = _subcommands(parser)
        if word not in commands and any(word in (a.choices or ()) for a in parser._actions
                                        if not a.option_strings):
            break  # a value of the command's own argument (`calibrate cpu`): its help says it
        if word not in commands:
            what = " ".join(["crossflow", *topic[:i]])
            values = [c for a in parser._actions if not a.option_strings
                      for c in (a.choices or ()) if c != "help"]
            raise ConfigError(f"'{what}' has no command {word!r}", file="command line",
                              allowed=", ".join(values) or "none (it has no sub-commands)")
        parser = commands[word]
    parser.print_help()
    return EXIT_OK


def _cmd_presets(args: argparse.Namespace) -> int:
    from crossflow.catalogue import catalogue

    groups = catalogue(args.kind)
    if args.json:
        print(json.dumps(groups, indent=2))
        return EXIT_OK
    columns = shutil.get_terminal_size((100, 24)).columns
    for i, (kind, entries) in enumerate(groups.items()):
        if i:
            print()
        print(f"{kind} ({len(entries)}):")
        width = max((len(e["name"]) for e in entries), default=0)
        room = max(40, columns - width - 5)  # one line each; --json has the whole text
        for e in entries:
            text = e["description"] + ("" if e["origin"] == "shipped" else f" [{e['origin']}]")
            if len(text) > room:
                text = text[: room - 1].rstrip() + "…"
            print(f"  {e['name']:<{width}}  {text}".rstrip())
    return EXIT_OK


def _cmd_predict(args: argparse.Namespace) -> int:
    from crossflow.predict import predict

    p = predict(workload=args.workload, hardware=args.hardware, system=args.system,
                parallelism=args.parallelism, mapping_order=args.mapping_order)
    fits = _fits_with(args, p)
    if args.json:
        out = p.to_dict()
        if fits:
            out["fits_with"] = [{"options": o, "memory_per_device_bytes":
                                 q.memory_per_device_bytes, "time_s": q.time_s}
                                for o, q in fits]
        print(json.dumps(out, indent=2, default=float))
    else:
        _print_prediction(p)
        _print_fits(fits, args.parallelism)
    return EXIT_OK if p.feasible else EXIT_INFEASIBLE


#: Parallelism options that shrink a transformer's memory per device, in Megatron-LM's
#: names, tried one at a time when a design does not fit, then a sharding with a
#: recomputation: the optimizer state sharded over the data-parallel ranks (the distributed
#: optimizer), or the weights and gradients too (Megatron-FSDP, its default ZeRO-3), and
#: activations recomputed
_SHARDING = ({"use_distributed_optimizer": True}, {"use_megatron_fsdp": True})
_RECOMPUTE = ({"recompute_granularity": "selective"}, {"recompute_granularity": "full"})


def _fits_with(args: argparse.Namespace, p) -> list[tuple[dict, object]]:
    """For a transformer the memory check refused: the options above that make the same
    design fit, each with the prediction it then gets (the model's own verdict, not a rule
    of thumb), the fastest first; the pairs of options only where no single one fits."""
    if p.feasible or p.details.get("rejected_by") != "memory_check" or not args.parallelism:
        return []
    from crossflow.config import load_spec
    from crossflow.parallel import parse_parallelism
    from crossflow.predict import predict

    spec = load_spec(args.workload, "workloads")
    if spec.kind != "transformer":
        return []  # the options are a transformer's (Megatron-LM's)
    par = parse_parallelism(args.parallelism)
    recompute = (*_light_recompute(spec), *_RECOMPUTE)

    def tried(options: dict) -> tuple[dict, object] | None:
        update = {("zero1" if k == "use_distributed_optimizer" else k): v
                  for k, v in options.items()}
        if all(getattr(par, k) == v for k, v in update.items()):
            return None  # already so
        try:
            q = predict(workload=args.workload, hardware=args.hardware, system=args.system,
                        parallelism=par.model_copy(update=update),
                        mapping_order=args.mapping_order)
        except ConfigError:  # an option this design cannot take is no remedy
            return None
        return (options, q) if q.feasible else None

    fits = [f for f in map(tried, (*_SHARDING, *recompute)) if f]
    fits += _block_recompute(spec, par, tried)
    if not fits:
        fits = [f for f in (tried({**s, **r}) for s in _SHARDING for r in recompute) if f]
    return sorted(fits, key=lambda f: f[1].time_s)


def _block_recompute(spec, par, tried) -> list[tuple[dict, object]]:
    """Full recomputation of only the first N layers of each pipeline chunk (Megatron-LM's
    block method), N the fewest that fit, found by bisection (memory falls as N grows);
    none where the design already recomputes every layer or only a whole chunk fits."""
    from crossflow.parallel.spec import chunk_layers

    if spec.activation_recompute == "full" and par.recompute_granularity in (None, "full"):
        return []
    strategy = par.to_strategy()
    chunk = max(par.chunk_split(spec.num_layers)
                or chunk_layers(spec.num_layers, strategy.pp * strategy.vp))

    def block(n: int) -> tuple[dict, object] | None:
        return tried({"recompute_granularity": "full", "recompute_method": "block",
                      "recompute_num_layers": n})

    lo, hi, best = 1, chunk - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        found = block(mid)
        if found:
            best, hi = found, mid - 1
        else:
            lo = mid + 1
    return [best] if best else []


def _light_recompute(spec) -> tuple[dict, ...]:
    """The selective recomputation Megatron-Bridge's guidance starts from where attention
    is not the memory (docs/model.md, "Recomputation by module"): MLA's up-projections,
    and an MoE model's separate norms and expert activations — cheap reruns of large
    outputs; none for a dense model without MLA."""
    modules = (("layernorm", "moe_act") if spec.moe else ()) + (
        ("mla_up_proj",) if spec.multi_latent_attention else ())
    if not modules:
        return ()
    return ({"recompute_granularity": "selective", "recompute_modules": modules},)


def _print_fits(fits: list[tuple[dict, object]], parallelism: str) -> None:
    from crossflow.units import fmt_bytes, fmt_time

    if not fits:
        return
    print("  fits with (the same design with these parallelism options, Megatron-LM's names):")
    rows = [(_yaml_pairs(o), q) for o, q in fits]
    width = max(len(text) for text, _ in rows)
    for text, q in rows:
        print(f"    {text:<{width}}  memory/device {fmt_bytes(q.memory_per_device_bytes):>8}"
              f"  time {fmt_time(q.time_s)}")
    print(f"  to use the fastest: {_with_options(parallelism, fits[0][0])}")


def _recompute_text(d: dict) -> str:
    """The recomputation a prediction ran: ``full``, ``full (block: the first 5 layers of
    each chunk)``, ``selective (core_attn, moe_act)``, ``none``."""
    mode = d["activation_recompute"]
    if mode == "selective":
        return f"selective ({', '.join(d['recompute_modules']) or 'no module'})"
    if mode == "full" and d.get("recompute_method") == "block":
        return (f"full (block: the first {d['recompute_num_layers']} layers of each "
                "pipeline chunk)")
    if mode == "full" and d.get("recompute_num_layers", 1) > 1:
        return f"full (uniform: groups of {d['recompute_num_layers']} layers)"
    return mode


def _execution_text(d: dict) -> str:
    """The execution options a prediction ran with, in words ("" for none): ``one CUDA
    graph per iteration, expert all-to-alls overlapped, FP8 attention``."""
    impl, modules = d.get("cuda_graph_impl", "none"), d.get("cuda_graph_modules", [])
    parts = []
    if impl == "full_iteration":
        parts.append("one CUDA graph per iteration")
    elif impl != "none":
        parts.append(f"{impl} CUDA graphs of " + (", ".join(modules) or "whole layers"))
    if d.get("overlap_moe_expert_parallel_comm"):
        parts.append("expert all-to-alls overlapped")
    if d.get("fp8_dot_product_attention"):
        parts.append("FP8 attention")
    return ", ".join(parts)


def _window_text(d: dict) -> str:
    """A sliding window in words: ``128 keys up to each query, on 18 of 36 layers``."""
    left, right = d["window_size"]
    keys = (f"{left + 1} keys up to each query" if right == 0 else
            f"{left} keys before and {right} after each query")
    return f"{keys}, on {d['windowed_layers']} of {d['num_layers']} layers"


def _yaml_pairs(mapping: dict) -> str:
    """``key: value, ...`` as YAML reads them back (booleans lowercase)."""
    def text(v) -> str:
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, (tuple, list)):
            return "[" + ", ".join(map(str, v)) + "]"
        return str(v)

    return ", ".join(f"{k}: {text(v)}" for k, v in mapping.items())


def _with_options(parallelism: str, options: dict) -> str:
    """How to pass ``options`` beside the ``--parallelism`` value given: into its file, or
    as an inline mapping of what was given (an inline mapping, a preset's keys, or a
    strategy name) and the options."""
    import shlex

    from crossflow.config import preset_names
    from crossflow.config.base import parse_yaml
    from crossflow.parallel import parse_parallelism

    text = parallelism.strip()
    if text.endswith((".yaml", ".yml")) or "/" in text:
        return f"add `{_yaml_pairs(options)}` to {text}"
    if text.startswith("{"):
        given = parse_yaml(text, key="parallelism")
    elif text in preset_names("parallelism"):
        given = parse_parallelism(text).model_dump(exclude_unset=True, exclude={"name"})
    else:
        given = {"strategy": text}
    merged = {k: v for k, v in given.items() if k not in options} | options
    return f"--parallelism {shlex.quote('{' + _yaml_pairs(merged) + '}')}"


def _print_prediction(p) -> None:
    from crossflow.units import fmt_bytes, fmt_energy, fmt_rate, fmt_time

    print(f"{p.workload} on {p.hardware}")
    for note in p.notes:
        print(f"  note: {note}")
    if not p.feasible:
        print(f"  INFEASIBLE: {p.reason}")
        return
    d = p.details
    if "strategy" in d:
        # the degrees outside the grid, as the strategy name takes them (-c2, -e8, -et2)
        extra = "".join(f"-{tag}{d[key]}" for tag, key in (
            ("c", "context_parallel"), ("e", "expert_parallel"),
            ("et", "expert_tensor_parallel")) if d.get(key, 1) > 1)
        print(f"  strategy      {d['strategy']}{extra} on {d['devices']} devices"
              + (f", mapping order {d['mapping_order']}" if "mapping_order" in d else ""))
    print(f"  time          {fmt_time(p.time_s)}")
    if "activation_recompute" in d:
        print(f"  recompute     {_recompute_text(d)}")
    if executes := _execution_text(d):
        print(f"  executes      {executes}")
    if "window_size" in d:
        print(f"  window        {_window_text(d)}")
    # the achieved rate counts the FLOPs the device runs, recomputed ones included; MFU
    # counts the model's FLOPs only (Megatron's convention), so the two differ by the
    # recomputation
    recomputes = d.get("activation_recompute", "none") != "none"
    print(f"  achieved      {fmt_rate(p.achieved_flops_per_s)}"
          + (" per device" if "strategy" in d else "")
          + (" (hardware FLOPs: recomputation included)" if recomputes else ""))
    if "model_flops_utilization" in d:
        print(f"  MFU           {d['model_flops_utilization'] * 100:.1f} %"
              + (" (model FLOPs only)" if recomputes else ""))
    print(f"  bottleneck    {p.bottleneck}")
    print(f"  memory/device {fmt_bytes(p.memory_per_device_bytes)}"
          + (f" ({d['memory_stage']}, the fullest)" if "memory_stage" in d else ""))
    print(f"  energy        {fmt_energy(p.energy_J)}")
    moved = p.details.get("bytes_per_level", {})
    print("  breakdown (roofline: compute and memory times overlap; total = slowest + launch):"
          if "breakdown_overlap" in p.details else "  breakdown:")
    for key, seconds in p.breakdown.items():
        level = key.removesuffix("_s")
        extra = f"  ({fmt_bytes(moved[level])})" if level in moved else ""
        print(f"    {level:<22} {fmt_time(seconds):>10}{extra}")
    hidden = {k: v for k, v in d.get("hidden_comm_s", {}).items() if v > 0}
    if hidden:  # communication overlapped with computation: not in the time above
        print("  communication hidden behind computation (not in the time; the breakdown "
              "has what stays exposed):")
        for key, seconds in hidden.items():
            print(f"    {key.removesuffix('_s'):<22} {fmt_time(seconds):>10}")


def _cmd_check(args: argparse.Namespace) -> int:
    from crossflow.checks import check_file

    errors = []
    for file in args.files:
        try:
            print(f"{file}: ok ({check_file(file)})")
        except ConfigError as exc:
            if args.debug:
                raise
            errors.append(exc)
            for one in exc.every():  # every error found in the file, one paragraph each
                print(f"crossflow: error: {one_paragraph(str(one))}", file=sys.stderr)
    return EXIT_BAD_INPUT if errors else EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    from crossflow.validation import run_validation

    ok = run_validation(args.what, csv_path=args.csv, summary=args.summary)
    return EXIT_OK if ok else EXIT_TOLERANCE


def _cmd_calibrate(args: argparse.Namespace) -> int:
    if args.what == "software":
        from crossflow.validation.refit import refit_all

        refit_all()
        return EXIT_OK
    from crossflow.calibrate import calibrate_cpu

    path = calibrate_cpu(Path(args.output), quick=args.quick, option="--output",
                         overwrite=args.force, force="--force")
    print(f"wrote {path}")
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    import time

    from crossflow.reports import run_report

    t0 = time.perf_counter()
    path = run_report(args.name, args.out, quick=args.quick, tracking_uri=args.tracking_uri)
    print(f"{path} ({time.perf_counter() - t0:.1f} s; logged to MLflow experiment 'reports')")
    return EXIT_OK


def _cmd_compare(args: argparse.Namespace) -> int:
    from crossflow.search.compare import compare, main_table
    from crossflow.search.study import load_study

    setup = load_study(args.name)
    if args.storage is not None:  # before the best-known search and any run
        from crossflow.search.storage import check_storage

        check_storage(args.storage, key="--storage")
    for option, value in (("--seeds", args.seeds), ("--budget", args.budget),
                          ("--workers", args.workers)):
        if value < 1:
            raise ConfigError("must be >= 1", file="command line", key=option, value=value)
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    try:
        result = compare(setup, samplers=samplers, seeds=args.seeds, budget=args.budget,
                         workers=args.workers, storage=args.storage,
                         tracking_uri=args.tracking_uri, track=not args.no_tracking,
                         root=args.root, progress=not args.quiet)
    except ConfigError as exc:  # compare's arguments are this command's options
        if exc.key in ("samplers", "budget") and not exc.file:
            raise ConfigError(exc.problem, file="command line", key=f"--{exc.key}",
                              value=exc.value, allowed=exc.allowed) from None
        raise
    print(main_table(result))
    return EXIT_OK


def _cmd_ui(args: argparse.Namespace) -> int:
    from crossflow.search.tracking import launch_ui

    return launch_ui(args.tracking_uri, host="127.0.0.1", port=args.port)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    # optuna and optuna_dashboard are imported when the dashboard starts, not before
    from crossflow.search.tracking.dashboard import serve_dashboard

    return serve_dashboard(args.name, args.storage, host="127.0.0.1", port=args.port)
