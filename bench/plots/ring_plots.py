"""Draws ring scaling and memory plots from the ring benchmark tables of one session.

Usage: python3 bench/plots/ring_plots.py OUT_PREFIX TABLE.md [TABLE.md ...]
e.g.   python3 bench/plots/ring_plots.py docs/ring_2gpu docs/results/h200x2-*.md
writes OUT_PREFIX_scaling.png and OUT_PREFIX_memory.png.

Reads the markdown tables that bench/ring/ring_bench and peer_context_parallel.py print
(columns: implementation, GPUs, mask, N, ms, TFLOP/s per GPU, memory per GPU, ...) and
plots causal TFLOP/s per GPU and memory per GPU against N for ringattn and PyTorch's
context parallel, measured in the same session on the same machine. Needs matplotlib.
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_rows(paths):
    rows = []
    for path in paths:
        header = None
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.startswith("|") or line.startswith("| ---"):
                    continue
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if cells[0] == "implementation":
                    header = cells
                    continue
                if header:
                    rows.append(dict(zip(header, cells)))
    return rows


def gpu_name(paths):
    """The GPU model the tables name ("H200", "H100"), or "" if none does."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            found = re.search(r"NVIDIA (H\d+)", f.read())
        if found:
            return found.group(1)
    return ""


def series(rows, implementation, gpus, mask, column):
    points = sorted(
        (int(r["N"]), float(r[column]))
        for r in rows
        if r["implementation"] == implementation and r["GPUs"] == str(gpus)
        and r["mask"] == mask)
    return [p[0] for p in points], [p[1] for p in points]


def memory_column(row_keys):
    for key in ("pool GiB per GPU", "peak allocated GiB per GPU"):
        if key in row_keys:
            return key
    raise KeyError("no memory column")


def main(prefix, paths):
    rows = read_rows(paths)
    gpu = gpu_name(paths)
    on = f" ({gpu})" if gpu else ""
    lines = [
        ("ringattn", 1, "ringattn, 1 GPU", "-o"),
        ("ringattn", 2, "ringattn, 2 GPUs", "-s"),
        ("ringattn", 4, "ringattn, 4 GPUs", "-^"),
        ("PyTorch SDPA cuDNN via CP", 1, "PyTorch SDPA cuDNN, 1 GPU", "--o"),
        ("PyTorch CP cuDNN (allgather)", 2, "PyTorch CP allgather, 2 GPUs", "--s"),
        ("PyTorch CP cuDNN (alltoall)", 2, "PyTorch CP alltoall, 2 GPUs", ":s"),
        ("PyTorch CP cuDNN (allgather)", 4, "PyTorch CP allgather, 4 GPUs", "--^"),
        ("PyTorch CP cuDNN (alltoall)", 4, "PyTorch CP alltoall, 4 GPUs", ":^"),
    ]
    for column, title, out, label in (
        ("TFLOP/s per GPU", "Causal attention, bf16, 32 heads, D=128" + on,
         prefix + "_scaling.png", "TFLOP/s per GPU"),
        (None, "Memory per GPU, causal" + on, prefix + "_memory.png",
         "GiB per GPU"),
    ):
        plt.figure(figsize=(7, 4.2))
        for implementation, gpus, name, style in lines:
            matching = [r for r in rows if r["implementation"] == implementation]
            if not matching:
                continue
            col = column or memory_column(matching[0].keys())
            xs, ys = series(rows, implementation, gpus, "causal", col)
            if xs:
                plt.plot(xs, ys, style, label=name)
        plt.xscale("log", base=2)
        plt.xlabel("sequence length N")
        plt.ylabel(label)
        plt.title(title)
        plt.grid(True, alpha=0.3)
        plt.legend(fontsize=8)
        plt.tight_layout()
        plt.savefig(out, dpi=110)
        print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
