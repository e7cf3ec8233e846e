"""Time training iterations of the paper's LSTM language model on a GPU with torch.

    python measure_torch_lstm.py --preset h200-sxm-141gb [--output FILE] [--repeat 10]

The model of ``crossflow.workloads.lstm`` (the DeepFlow paper's §9 language model): token
embedding, ``layers`` LSTM layers of ``hidden`` units with 4 gates, the vocabulary
projection and softmax cross-entropy at every one of ``seq`` time steps, fp16, and plain SGD
(parameter -= lr · gradient).  One iteration: forward, loss, backward, optimizer step.  Two
implementations per shape:

* ``loop``: the model as the paper writes it: per time step and layer one GEMM
  [x_t, h_{t-1}] · W and the gates' point-wise ops (eager torch: several kernels), the
  projection per time step;
* ``cudnn``: ``torch.nn.LSTM`` (cuDNN's fused recurrent kernels) and one projection GEMM over
  all time steps.

Each row is the median of ``--repeat`` CUDA-event-timed iterations after 3 warm-up ones.
``tflops`` counts the model's GEMM FLOPs (forward, and two of the same size backward) over
that time.  The header names the hardware preset (``# preset: NAME``).  Written to a
temporary file and renamed, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import _record

#: (batch, hidden, layers, seq, vocab)
SHAPES = (
    (64, 1024, 2, 20, 32000),
    (512, 1024, 2, 20, 32000),
    (64, 4096, 2, 20, 32000),
    (512, 4096, 2, 20, 32000),
    (128, 8192, 2, 20, 32000),
    (512, 8192, 2, 20, 32000),
)


def _loop_model(torch, B: int, H: int, L: int, S: int, V: int):
    """The paper's formulation, step by step; returns (parameters, one iteration's loss fn)."""
    dev, dt_ = "cuda", torch.float16
    emb = torch.nn.Parameter(torch.randn(V, H, device=dev, dtype=dt_) * 0.01)
    ws = [torch.nn.Parameter(torch.randn(2 * H, 4 * H, device=dev, dtype=dt_) * 0.01)
          for _ in range(L)]
    bs = [torch.nn.Parameter(torch.zeros(4 * H, device=dev, dtype=dt_)) for _ in range(L)]
    proj = torch.nn.Parameter(torch.randn(H, V, device=dev, dtype=dt_) * 0.01)
    tokens = torch.randint(0, V, (S, B), device=dev)
    target = torch.randint(0, V, (S, B), device=dev)

    def loss():
        h = [torch.zeros(B, H, device=dev, dtype=dt_) for _ in range(L)]
        c = [torch.zeros(B, H, device=dev, dtype=dt_) for _ in range(L)]
        total = 0.0
        for t in range(S):
            x = emb[tokens[t]]
            for layer in range(L):
                gates = torch.addmm(bs[layer], torch.cat([x, h[layer]], dim=1), ws[layer])
                i, f, g, o = gates.chunk(4, dim=1)
                c[layer] = torch.sigmoid(f) * c[layer] + torch.sigmoid(i) * torch.tanh(g)
                h[layer] = torch.sigmoid(o) * torch.tanh(c[layer])
                x = h[layer]
            total = total + torch.nn.functional.cross_entropy(x @ proj, target[t])
        return total

    return [emb, *ws, *bs, proj], loss


def _cudnn_model(torch, B: int, H: int, L: int, S: int, V: int):
    dev, dt_ = "cuda", torch.float16
    emb = torch.nn.Embedding(V, H).to(dev, dt_)
    lstm = torch.nn.LSTM(H, H, num_layers=L).to(dev, dt_)
    head = torch.nn.Linear(H, V, bias=False).to(dev, dt_)
    tokens = torch.randint(0, V, (S, B), device=dev)
    target = torch.randint(0, V, (S, B), device=dev)

    def loss():
        out, _ = lstm(emb(tokens))
        return torch.nn.functional.cross_entropy(head(out).view(S * B, V), target.view(-1))

    return [*emb.parameters(), *lstm.parameters(), *head.parameters()], loss


def time_iteration(torch, params, loss, repeat: int) -> float:
    opt = torch.optim.SGD(params, lr=1e-6)

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()

    return statistics.median(_record.timings(torch, step, repeat))


def main() -> int:
    parser = _record.arguments(__doc__, "torch_lstm", repeat=10)
    args = parser.parse_args()

    import torch

    if _record.no_cuda(torch):
        return 2
    out = Path(args.output or Path(__file__).with_name(f"torch_lstm_{args.preset}.csv"))
    rows = []
    for B, H, L, S, V in SHAPES:
        flops = 3 * S * (L * 2 * B * 2 * H * 4 * H + 2 * B * H * V)
        for name, build in (("loop", _loop_model), ("cudnn", _cudnn_model)):
            try:
                params, loss = build(torch, B, H, L, S, V)
                t = time_iteration(torch, params, loss, args.repeat)
            except RuntimeError as exc:  # out of memory, an unsupported kernel, ...
                print(f"skipped {name} {(B, H, L, S, V)}: {str(exc)[:200]}", file=sys.stderr,
                      flush=True)
                continue
            finally:
                params = loss = None
                torch.cuda.empty_cache()
            rows.append(f"{name},{B},{H},{L},{S},{V},fp16,{t:.9g},{flops / t / 1e12:.1f}")
            print(rows[-1], flush=True)
    header = _record.header(torch, __file__, f"median of {args.repeat} CUDA-event-timed "
                            "iterations (zero_grad, forward, loss, backward, SGD step) after 3 "
                            "warm-up ones", args.preset, cudnn=True)
    _record.write_csv(out, header, "impl,batch,hidden,layers,seq,vocab,dtype,median_s,tflops",
                      rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
