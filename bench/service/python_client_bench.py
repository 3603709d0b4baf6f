#!/usr/bin/env python3
"""One-shot requests through the Python client, over one or several streams.

Times ringattn.Client.attend end to end against a running coordinator for
each --streams setting (upload/download streams and, optionally, the output
dtype; alternating over --repeats rounds) and checks --check_rows output rows against float64. Inputs
are bf16 torch tensors when torch imports, else float16 numpy arrays; their
rows are drawn from a pool of random rows, so making them is cheap.

  python_client_bench.py --target HOST:PORT --tokens 262144 \
      --streams 1/1/fp32,1/1,4/4

Prints a markdown table: end to end s, the coordinator's compute phase s, the
slowest worker's compute s, GB up and down, and the rate of those bytes over
the time outside the compute phase.
"""

import argparse
import sys
import time

import numpy as np

import ringattn

POOL_ROWS = 65521  # prime: row i of a tensor is pool row (i * 7919 + seed) % it


def make_tensor(tokens, heads, dim, seed, torch):
    rng = np.random.default_rng(seed)
    pool = rng.uniform(-2, 2, (POOL_ROWS, heads, dim)).astype(np.float32)
    rows = (np.arange(tokens, dtype=np.int64) * 7919 + seed) % POOL_ROWS
    if torch is None:
        return pool.astype(np.float16)[rows]
    return torch.from_numpy(pool).to(torch.bfloat16)[torch.from_numpy(rows)]


def as_float64(x):
    """x in float64, a torch tensor (multi-threaded) or a numpy array."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return x.double()


def reference_rows(q, k, v, rows, causal, kv_heads):
    """float64 O[rows] of attention of q over k, v ([N, H, D], GQA) for the
    query heads of K/V heads `kv_heads`; the other heads stay NaN."""
    hq, dim = q.shape[1], q.shape[2]
    hkv = k.shape[1]
    out = np.full((len(rows), hq, dim), np.nan)
    for g in kv_heads:
        kg, vg = as_float64(k[:, g]), as_float64(v[:, g])
        for h in range(g * hq // hkv, (g + 1) * hq // hkv):
            for r, row in enumerate(rows):
                keys = row + 1 if causal else len(kg)
                s = kg[:keys] @ as_float64(q[row, h]) / np.sqrt(dim)
                p = (s - s.max()).exp() if hasattr(s, "exp") else np.exp(
                    s - s.max())
                out[r, h] = np.asarray(p @ vg[:keys] / p.sum())
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--tokens", type=int, default=262144)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv_heads", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--causal", type=int, default=1)
    parser.add_argument("--streams", default="1/1,4/4",
                        help="comma-separated UPLOAD/DOWNLOAD[/OUTPUT_DTYPE]: "
                        "stream counts and the dtype O travels in (default: "
                        "the inputs'); 'default' calls attend() without "
                        "them (also for clients older than these options)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--check_rows", type=int, default=3)
    parser.add_argument("--check_kv_heads", type=int, default=0,
                        help="check the query heads of this many K/V heads, "
                        "the first and the last ones (0: all)")
    parser.add_argument("--chunk_bytes", type=int, default=4 << 20)
    args = parser.parse_args()
    settings = [(s.split("/") + [None, None])[:3]
                for s in args.streams.split(",")]
    try:
        import torch
    except Exception:  # any failure to import means: numpy inputs
        torch = None
    q, k, v = (make_tensor(args.tokens, h, args.dim, seed, torch)
               for seed, h in ((1, args.heads), (2, args.kv_heads),
                               (3, args.kv_heads)))
    rows = np.linspace(0, args.tokens - 1, args.check_rows).astype(int)
    heads = list(range(args.kv_heads))
    if 0 < args.check_kv_heads < args.kv_heads:
        half = args.check_kv_heads // 2
        heads = heads[:args.check_kv_heads - half] + heads[args.kv_heads -
                                                          half:]
    expected = reference_rows(q, k, v, rows, args.causal, heads)
    checked = ~np.isnan(expected)
    print(f"{args.tokens} tokens, {args.heads}/{args.kv_heads} heads, "
          f"D={args.dim}, {'bf16 (torch)' if torch else 'fp16 (numpy)'}, "
          f"causal={bool(args.causal)}", file=sys.stderr)
    print("| streams up/down/output | end to end s | compute phase s | slowest "
          "worker s | GB up | GB down | GB/s outside compute | max err / "
          "RMS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with ringattn.Client(args.target, timeout=3600,
                         chunk_bytes=args.chunk_bytes) as client:
        for _ in range(args.repeats):
            for up, down, output in settings:
                options = {} if up == "default" else dict(
                    upload_streams=int(up), download_streams=int(down),
                    output_dtype=output)
                start = time.perf_counter()
                o = client.attend(q, k, v, causal=bool(args.causal),
                                  **options)
                seconds = time.perf_counter() - start
                summary = client.last_summary
                compute = sum(t.seconds for t in summary.timings
                              if t.phase == "compute")
                slowest = max(w.compute_seconds for w in summary.workers)
                got = np.asarray(as_float64(o[rows.tolist()]))
                error = (np.abs(got - expected)[checked].max() /
                         np.sqrt((expected[checked] ** 2).mean()))
                moved = (summary.bytes_in + summary.bytes_out) / 1e9
                name = up if up == "default" else (
                    f"{up}/{down}/{output or 'auto'}")
                print(f"| {name} | {seconds:.2f} | {compute:.2f} | "
                      f"{slowest:.2f} | {summary.bytes_in / 1e9:.2f} | "
                      f"{summary.bytes_out / 1e9:.2f} | "
                      f"{moved / max(seconds - compute, 1e-9):.2f} | "
                      f"{error:.3f} {'ok' if error < 0.05 else 'WRONG'} |",
                      flush=True)


if __name__ == "__main__":
    main()
