"""Sliding-window attention in Megatron-LM's names (``--window-size``,
``--window-attn-skip-freq``): which layers' attention sees only the keys near each query,
and the checks Transformer Engine's attention makes of the window (docs/model.md,
"Sliding-window attention").

A window is (left, right): the keys before and after each query it sees, -1 unlimited
(GPT-OSS: (127, 0), each query and the 127 keys before it, in every other layer).  Its
price is in the flash kernel, which skips the tiles outside the window (the kernel layer's
``score_share``); an unfused attention computes the whole s × s scores and masks them, as
Transformer Engine's unfused path does, so a window changes nothing there.
"""

from __future__ import annotations

from crossflow.errors import ConfigError

#: Megatron-LM's masks: a causal one sees no key after its query
_MASKS = {True: "(-1, 0) or (left >= 0, 0) under the causal mask",
          False: "(-1, -1) or (left >= 0, right >= 0) without a causal mask"}


def window_layers(spec) -> tuple[bool, ...]:
    """Per layer (from 0), whether its attention is windowed: Megatron-Core's
    ``is_layer_window_attention`` over the 1-indexed layer number (of the whole stack, a
    hybrid stack's Mamba and MLP layers counted): every layer, or all but every N-th
    (``window_attn_skip_freq`` N), or those the list marks 1.  A layer without attention
    (a hybrid stack's M, - or E) has none, nor has any under a window that limits nothing
    ((-1, 0), (-1, -1))."""
    L, window, freq = spec.num_layers, spec.window_size, spec.window_attn_skip_freq
    if window is None or window[0] == -1:  # (-1, 0), (-1, -1): every key the mask allows
        return (False,) * L
    if freq is None:
        marked = (True,) * L
    elif isinstance(freq, int):
        marked = tuple((i + 1) % freq != 0 for i in range(L))
    else:
        marked = tuple(bool(v) for v in freq)
    return tuple(m and "*" in kind for m, kind in zip(marked, spec.layer_kinds, strict=True))


def window_details(spec) -> dict:
    """What a prediction's details say of the window ({} without one): ``window_size`` and
    how many of the ``num_layers`` layers have it (``windowed_layers``)."""
    windowed = sum(window_layers(spec))
    return ({"window_size": list(spec.window_size), "windowed_layers": windowed,
             "num_layers": spec.num_layers} if windowed else {})


def check_window(spec) -> None:
    """Raise a ConfigError naming the key unless the window fits the attention mask (TE's
    ``check_set_window_size``) and the layers (``window_attn_skip_freq``)."""
    window, freq = spec.window_size, spec.window_attn_skip_freq
    if window is None:
        if freq is not None:
            raise ConfigError("says which layers have a sliding window, and the workload "
                              "sets no window_size", key="window_attn_skip_freq",
                              value=_text(freq), allowed="none without window_size")
        return
    left, right = window
    if not (left >= -1 and right == 0 if spec.causal
            else window == (-1, -1) or (left >= 0 and right >= 0)):
        raise ConfigError(
            "is the keys (left, right) each query sees, -1 unlimited, and does not fit the "
            "attention mask (Transformer Engine's check_set_window_size)",
            key="window_size", value=list(window), allowed=_MASKS[spec.causal])
    if isinstance(freq, tuple) and (len(freq) != spec.num_layers
                                    or any(v not in (0, 1) for v in freq)):
        raise ConfigError(
            "marks each layer 1 (sliding window) or 0 (full attention)",
            key="window_attn_skip_freq", value=_text(freq),
            allowed=f"a list of {spec.num_layers} zeros and ones (num_layers)")
    if window[0] >= 0 and not any(window_layers(spec)):
        raise ConfigError(
            "puts a sliding window on no layer with attention (* in the layer pattern)",
            key="window_attn_skip_freq" if freq is not None else "window_size",
            value=_text(freq) if freq is not None else list(window),
            allowed="a pattern that windows at least one attention layer")


def check_window_under_cp(spec, cp: int) -> None:
    """Transformer Engine's context parallelism over a ring of point-to-point transfers
    (``cp_comm_type: p2p``, Megatron's default and what CrossFlow prices) has no fused
    (cuDNN) sliding-window attention: ``get_attention_backend`` disables the kernel for it."""
    if cp > 1 and any(window_layers(spec)):
        raise ConfigError(
            "runs attention over a ring of context-parallel ranks, where Transformer Engine's "
            "fused attention does not run a sliding window (window_size), and its all-to-all "
            "form is not modelled", key="context_parallel", value=cp,
            allowed="1 for a workload with sliding-window layers")


def _text(value) -> int | list[int]:
    return value if isinstance(value, int) else list(value)
