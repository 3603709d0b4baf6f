"""The PyTorch peer of gpu_decode_bench, and the floor, measured in one run.

Few query rows against a long K/V: torch SDPA restricted to its cuDNN and to its
FlashAttention backend, bf16, Hq=32, Hkv=8 unless --q-heads and --kv-heads say
otherwise (enable_gqa; where a backend refuses GQA, K/V are expanded to Hq heads
first and the table says so), D=128, batch 1,
dense, tensors laid out [B, N, H, D] as ringattn's are. Also measures, in the
same process, the device copy rate (a large tensor copied, bytes read +
written) and the bf16 matmul rate (8192^3), and gives each shape's floor =
max(K/V bytes / copy rate, FLOPs / matmul rate) with K/V bytes = 2 Nk Hkv D 2
and FLOPs = 4 Nq Nk Hq D. With --ours (gpu_decode_bench --csv output), prints
last a table of ours beside the floor and the best PyTorch backend.

    python peer_decode.py [--kv-lengths 1048576 4194304]
        [--q-lengths 1 16 256 4096] [--q-heads 32 --kv-heads 8] [--seconds 1]
        [--ours ours.csv]
"""

import argparse
import csv
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

Q_HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
BACKENDS = (
    ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
    ("SDPA flash", SDPBackend.FLASH_ATTENTION),
)


def median_ms(run, seconds, warmup=1):
    """Median milliseconds of `run` over enough calls for about `seconds`."""
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)

    def time_one():
        start.record()
        run()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    last = 0.0
    for _ in range(warmup):
        last = time_one()
    calls = min(20, max(3, int(seconds * 1e3 / last)))
    return statistics.median(time_one() for _ in range(calls))


def copy_rate(seconds):
    """Device copy bytes (read + written) per second, 4 GiB tensors."""
    src = torch.empty(2 << 30, dtype=torch.bfloat16, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), seconds, warmup=2)
    rate = 2 * src.numel() * 2 / (ms * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return rate


def matmul_rate(seconds):
    """bf16 FLOP/s of an 8192^3 matmul."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: torch.matmul(a, b), seconds, warmup=3)
    return 2.0 * n**3 / (ms * 1e-3)


def measure(nk, q_lengths, seconds):
    """{(nq, backend): (ms, note)} for one K/V length."""
    gen = torch.Generator(device="cuda").manual_seed(nk)

    def operand(n, heads):
        x = torch.rand(1, n, heads, HEAD_DIM, device="cuda", generator=gen)
        return (4 * x - 2).to(torch.bfloat16).transpose(1, 2)

    k, v = operand(nk, KV_HEADS), operand(nk, KV_HEADS)
    results = {}
    for nq in q_lengths:
        q = operand(nq, Q_HEADS)
        for name, backend in BACKENDS:
            try:
                with sdpa_kernel(backend):
                    ms = median_ms(
                        lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                        seconds,
                    )
                results[(nq, name)] = (ms, "")
                continue
            except RuntimeError as error:
                gqa_error = str(error).splitlines()[0][:60]
            try:
                group = Q_HEADS // KV_HEADS
                k4 = k.repeat_interleave(group, dim=1)
                v4 = v.repeat_interleave(group, dim=1)
                with sdpa_kernel(backend):
                    ms = median_ms(
                        lambda: F.scaled_dot_product_attention(q, k4, v4), seconds
                    )
                results[(nq, name)] = (ms, "K/V expanded")
            except (RuntimeError, torch.OutOfMemoryError) as error:
                results[(nq, name)] = (
                    float("nan"),
                    f"failed: {gqa_error}; expanded: {str(error).splitlines()[0][:60]}",
                )
            finally:
                k4 = v4 = None
                torch.cuda.empty_cache()
    return results


def read_ours(path):
    """{(path, nk, nq): ms} from gpu_decode_bench --csv."""
    ours = {}
    with open(path) as f:
        for path_name, nk, nq, ms in csv.reader(f):
            ours[(path_name, int(nk), int(nq))] = float(ms)
    return ours


def main():
    global Q_HEADS, KV_HEADS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-lengths", type=int, nargs="+", default=[1 << 20, 1 << 22])
    parser.add_argument("--q-lengths", type=int, nargs="+", default=[1, 16, 256, 4096])
    parser.add_argument("--q-heads", type=int, default=Q_HEADS)
    parser.add_argument("--kv-heads", type=int, default=KV_HEADS)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--ours", help="gpu_decode_bench --csv output")
    args = parser.parse_args()
    if args.kv_heads < 1 or args.q_heads % args.kv_heads:
        parser.error("--q-heads must be a positive multiple of --kv-heads")
    Q_HEADS, KV_HEADS = args.q_heads, args.kv_heads

    copy = copy_rate(args.seconds)
    flops_rate = matmul_rate(args.seconds)
    rows = []
    for nk in args.kv_lengths:
        measured = measure(nk, args.q_lengths, args.seconds)
        for nq in args.q_lengths:
            kv_bytes = 2.0 * nk * KV_HEADS * HEAD_DIM * 2
            flops = 4.0 * nq * nk * Q_HEADS * HEAD_DIM
            floor = max(kv_bytes / copy, flops / flops_rate) * 1e3
            rows.append((nk, nq, floor, [measured[(nq, name)] for name, _ in BACKENDS]))
        torch.cuda.empty_cache()

    print(
        f"\nPyTorch {torch.__version__} SDPA, {torch.cuda.get_device_name()}, "
        f"cuDNN {torch.backends.cudnn.version()}, bf16, Hq={Q_HEADS}, Hkv={KV_HEADS}, "
        f"D={HEAD_DIM}, B=1, dense (median ms). Measured here: copy "
        f"{copy / 1e9:.0f} GB/s (read + write), bf16 matmul {flops_rate / 1e12:.0f} TFLOP/s\n"
    )
    print("| Nk | Nq | floor | " + " | ".join(name for name, _ in BACKENDS) + " |")
    print("| --- | --- | --- |" + " --- |" * len(BACKENDS))
    for nk, nq, floor, cells in rows:
        text = [f"{ms:.3f}" + (f" ({note})" if note else "") for ms, note in cells]
        print(f"| {nk} | {nq} | {floor:.3f} | " + " | ".join(text) + " |")

    if not args.ours:
        return
    ours = read_ours(args.ours)
    print("\nSummary (ms; ratios > 1 mean ours is slower than the floor / faster than PyTorch)\n")
    print("| Nk | Nq | ours (the dispatcher's path) | ringattn cuDNN | floor | ours / floor | best PyTorch | PyTorch / ours |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for nk, nq, floor, cells in rows:
        picked = [(name, ms) for (name, k, q), ms in ours.items()
                  if name.startswith("dispatch:") and (k, q) == (nk, nq)]
        mine_path, mine = picked[0] if picked else ("decode", ours.get(("decode", nk, nq), float("nan")))
        cudnn = ours.get(("cudnn", nk, nq), float("nan"))
        best_ms, best_name = min(
            ((ms, name) for (ms, _), (name, _) in zip(cells, BACKENDS) if ms == ms),
            default=(float("nan"), "none"),
        )
        print(
            f"| {nk} | {nq} | {mine:.3f} ({mine_path.removeprefix('dispatch:')}) | {cudnn:.3f} | {floor:.3f} | {mine / floor:.2f} | "
            f"{best_ms:.3f} ({best_name}) | {best_ms / mine:.2f} |"
        )


if __name__ == "__main__":
    main()
