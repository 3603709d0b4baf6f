"""PyTorch's context parallel (ring attention), the peer of ring_bench.

torch.distributed.tensor.experimental.context_parallel with SDPA restricted to
its cuDNN backend, on the shapes ring_bench runs: bf16, batch 1, 32 heads,
head_dim 128, dense and causal (causal with PyTorch's head-tail load
balancing, dense without, as PyTorch requires), each KV rotate method
(set_rotate_method: allgather, alltoall). Every rank creates its own shard of
Q, K and V ([1, H, N / G, D]) directly; the context gets only a one-byte-per-
token placeholder buffer to learn the sequence length from, so the memory
figures are the ring's own, not those of sharding full-length tensors. Rank 0
prints markdown table rows with the columns of ring_bench's table: time of one
attention (the slowest rank, median of the timed runs), TFLOP/s per GPU (4 * N^2
* H * D per dense attention, half of it causal, divided by the GPUs), peak
memory allocated by PyTorch per GPU (from before Q, K, V exist) and the device
memory in use per GPU.

    torchrun --nproc_per_node=G peer_context_parallel.py [--lengths 65536 262144]
        [--masks dense causal] [--long-lengths 1048576]
        [--rotate allgather alltoall] [--header]
"""

import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import (
    _cp_options,
    set_rotate_method,
)
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS = 32
HEAD_DIM = 128
GIB = 1024.0**3


def flops(n, causal):
    return 4.0 * n * n * HEADS * HEAD_DIM * (0.5 if causal else 1.0)


def slowest(seconds, device):
    """The largest of every rank's `seconds`."""
    value = torch.tensor([seconds], device=device, dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


def run_case(mesh, device, n, causal, rotate, iterations, budget):
    """Times one case; returns (milliseconds, peak GiB, used GiB, runs)."""
    world = mesh.size()
    set_rotate_method(rotate)
    _cp_options.enable_load_balance = causal
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    shard = n // world
    q, k, v = (
        torch.randn(1, HEADS, shard, HEAD_DIM, device=device, dtype=torch.bfloat16)
        for _ in range(3)
    )
    placeholder = torch.empty(n, dtype=torch.uint8, device=device)
    warm_up = flops(n, causal) / world < 2e14
    times = []
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), context_parallel(
        mesh,
        buffers=[placeholder],
        buffer_seq_dims=[0],
        no_restore_buffers={placeholder},
    ):
        run = 0
        while True:
            dist.barrier()
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.cuda.synchronize(device)
            seconds = slowest(time.perf_counter() - start, device)
            del out
            timed = run > 0 or not warm_up
            run += 1
            if timed:
                times.append(seconds)
                if len(times) >= iterations or sum(times) > budget:
                    break
    peak = torch.cuda.max_memory_allocated(device) / GIB
    free, total = torch.cuda.mem_get_info(device)
    del q, k, v, placeholder
    return statistics.median(times) * 1e3, peak, (total - free) / GIB, len(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[65536, 262144])
    parser.add_argument("--masks", nargs="+", default=["dense", "causal"])
    parser.add_argument(
        "--long-lengths",
        type=int,
        nargs="*",
        default=[],
        help="lengths run causal only, timed once each, after the others",
    )
    parser.add_argument("--rotate", nargs="+", default=["allgather", "alltoall"])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--header", action="store_true", help="print the table header")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", timeout=datetime.timedelta(minutes=10), device_id=device
    )
    world = dist.get_world_size()
    rank = dist.get_rank()
    mesh = init_device_mesh("cuda", (world,))
    if rank == 0 and args.header:
        print(
            f"\nPyTorch {torch.__version__} context parallel, SDPA cuDNN "
            f"{torch.backends.cudnn.version()}, NCCL "
            f"{'.'.join(map(str, torch.cuda.nccl.version()))}, "
            f"{torch.cuda.get_device_name(device)}, bf16, B=1, Hq=Hkv={HEADS}, "
            f"D={HEAD_DIM}\n"
        )
        print(
            "| implementation | GPUs | mask | N | ms | TFLOP/s per GPU | peak "
            "allocated GiB per GPU | device GiB used per GPU | runs |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    # With one GPU there is nothing to rotate.
    methods = args.rotate if world > 1 else args.rotate[:1]
    cases = [(n, mask, args.iterations) for n in args.lengths for mask in args.masks]
    cases += [(n, "causal", 1) for n in args.long_lengths]
    for n, mask, iterations in cases:
        causal = mask == "causal"
        for rotate in methods:
            name = (
                f"PyTorch CP cuDNN ({rotate})"
                if world > 1
                else "PyTorch SDPA cuDNN via CP"
            )
            ms, peak, used, runs = run_case(
                mesh, device, n, causal, rotate, iterations, args.seconds
            )
            if rank == 0:
                tflops = flops(n, causal) / (ms * 1e-3) / world / 1e12
                print(
                    f"| {name} | {world} | {mask} | {n} | {ms:.1f} | "
                    f"{tflops:.0f} | {peak:.1f} | {used:.1f} | {runs} |",
                    flush=True,
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
