"""The PyTorch peer of gpu_attention_bench: SDPA on the same GPU and shapes.

torch.nn.functional.scaled_dot_product_attention restricted to its
FlashAttention-2 backend and to its cuDNN backend, the latter also with its softmax
statistics (the LSE, which ringattn's kernels always write, as a ring needs it to
merge: PyTorch's cuDNN call computes them only when autograd will need them, so that
column's inputs require grad), bf16, head_dim --head-dim (128), 32 query heads
and --kv-heads key/value heads (32; fewer is GQA, SDPA's enable_gqa),
batch 1, dense and causal, on tensors laid out [B, N, H, D] as ringattn's are
(SDPA sees them transposed to [B, H, N, D]). Prints a markdown table of TFLOP/s
(4 * N^2 * H * D per dense call, half of it causal), each the median of
several calls timed with CUDA events after warm-up.

    python peer_sdpa.py [--lengths 4096 16384 65536] [--seconds 2] [--kv-heads 8]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS = 32
WARMUP_CALLS = 2
# (column, backend, whether the inputs require grad)
BACKENDS = (
    ("SDPA flash", SDPBackend.FLASH_ATTENTION, False),
    ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION, False),
    ("SDPA cuDNN with LSE", SDPBackend.CUDNN_ATTENTION, True),
)


def median_milliseconds(run, seconds):
    """Median time of `run` over enough calls for about `seconds`."""
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)

    def time_one():
        start.record()
        run()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    last = 0.0
    for _ in range(WARMUP_CALLS):
        last = time_one()
    calls = min(20, max(3, int(seconds * 1e3 / last)))
    return statistics.median(time_one() for _ in range(calls))


def measure(n, causal, seconds, head_dim, kv_heads):
    """TFLOP/s of each backend for one shape, or the reason it did not run."""
    generator = torch.Generator(device="cuda").manual_seed(n)

    def operand(heads):
        x = torch.rand(1, n, heads, head_dim, device="cuda", generator=generator)
        return (4 * x - 2).to(torch.bfloat16).transpose(1, 2)

    q, k, v = operand(HEADS), operand(kv_heads), operand(kv_heads)
    gqa = {"enable_gqa": True} if kv_heads != HEADS else {}
    flops = 4.0 * n * n * HEADS * head_dim * (0.5 if causal else 1.0)
    cells = []
    for _, backend, with_lse in BACKENDS:
        inputs = [x.detach().requires_grad_(with_lse) for x in (q, k, v)]
        try:
            with sdpa_kernel(backend):
                ms = median_milliseconds(
                    lambda: F.scaled_dot_product_attention(
                        *inputs, is_causal=causal, **gqa
                    ),
                    seconds,
                )
            cells.append(f"{flops / (ms * 1e-3) / 1e12:.0f}")
        except RuntimeError as error:
            cells.append("failed: " + str(error).splitlines()[0][:80])
    return cells


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--kv-heads", type=int, default=HEADS)
    args = parser.parse_args()
    if args.kv_heads < 1 or HEADS % args.kv_heads != 0:
        parser.error(f"--kv-heads must divide {HEADS}")
    rows = []
    for n in args.lengths:
        for causal in (False, True):
            rows.append((n, "causal" if causal else "dense", measure(n, causal, args.seconds, args.head_dim, args.kv_heads)))
            torch.cuda.empty_cache()
    print(
        f"\nPyTorch {torch.__version__} SDPA, {torch.cuda.get_device_name()}, "
        f"cuDNN {torch.backends.cudnn.version()}, bf16, D={args.head_dim}, "
        f"Hq={HEADS}, Hkv={args.kv_heads}, B=1 (TFLOP/s, median)\n"
    )
    print("| N | mask | " + " | ".join(name for name, _, _ in BACKENDS) + " |")
    print("| --- | --- |" + " --- |" * len(BACKENDS))
    for n, mask, cells in rows:
        print(f"| {n} | {mask} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
