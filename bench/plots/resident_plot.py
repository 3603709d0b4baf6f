"""Draws query latency against resident contexts on 1 and 2 GPUs.

Usage: python3 bench/plots/resident_plot.py OUT.png TABLE.md
e.g.   python3 bench/plots/resident_plot.py docs/resident_contexts_2gpu.png \\
           docs/results/h200x2-resident-contexts.md

Reads the query tables bench/service/service_bench --query_rows prints
(columns context tokens, query rows, strategy, p50 ms, p99 ms, ..., slowest
worker's compute p50 ms, ..., found by the header row), each under a "## "
heading that names it, and
draws, per context length and query rows, the GPU time and the rest of the
end-to-end p50 as stacked bars, one panel per context length. Needs
matplotlib.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_queries(path):
    """{(title, context tokens): [(query rows, p50 ms, compute ms)]}"""
    rows = {}
    title = None
    compute = 5  # the column, as the older tables had it
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                title = line[3:].split("(")[0].split(",")[0].strip()
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) > 2 and cells[1] == "query rows":
                compute = next(i for i, c in enumerate(cells)
                               if c.startswith("slowest worker's compute"))
                continue
            if len(cells) <= compute or not cells[0].isdigit() or (
                    not cells[1].isdigit()):
                continue
            # Broadcast-Q rows name the merge too ("BROADCAST_Q/MERGE_...").
            if cells[2].split("/")[0] not in ("BROADCAST_Q", "PASS_KV",
                                              "PASS_Q"):
                continue
            key = (title, int(cells[0]))
            rows.setdefault(key, []).append(
                (int(cells[1]), float(cells[3]), float(cells[compute])))
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = read_queries(sys.argv[2])
    lengths = sorted({n for _, n in rows})
    fig, axes = plt.subplots(1, len(lengths), figsize=(5 * len(lengths), 4))
    if len(lengths) == 1:
        axes = [axes]
    for ax, n in zip(axes, lengths):
        labels, gpu, rest = [], [], []
        for (title, length), entries in sorted(rows.items()):
            if length != n:
                continue
            for q, p50, compute in entries:
                labels.append(f"{title}\n{q} rows")
                gpu.append(compute)
                rest.append(max(0.0, p50 - compute))
        x = range(len(labels))
        ax.bar(x, gpu, label="GPU time (slowest worker)")
        ax.bar(x, rest, bottom=gpu, label="rest of end to end (p50)")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("ms")
        ax.set_title(f"context of {n / 2**20:.0f}M tokens")
    axes[0].legend(fontsize=8)
    fig.suptitle("Queries of a resident context, Hq=32 Hkv=8 D=128 bf16, H200")
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
