"""Draws block-sparse speedup over dense against the fraction of pairs computed.

Usage: python3 bench/plots/sparse_plot.py OUT.png TABLE.md
e.g.   python3 bench/plots/sparse_plot.py docs/block_sparse_speedup.png \\
           docs/results/h100-hopper-kernel.md

Reads the table bench/gpu/sparse_bench prints (columns N, mask, pattern,
pairs of dense, dense cuDNN ms, dense ours ms, list ms (kernel), list on the
mma.sync kernel ms, cuDNN per rectangle ms (calls), ...) and draws, per N,
the speedup of the one-launch list and of cuDNN per rectangle over dense
cuDNN, against the fraction of pairs, with the ideal 1 / fraction. Needs
matplotlib.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_rows(path):
    """[(n, mask, pattern, pairs, dense ms, list ms, rectangles ms)]"""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 13 or not cells[0].isdigit():
                continue
            rows.append((int(cells[0]), cells[1], cells[2], float(cells[3]),
                         float(cells[4]), float(cells[6].split()[0]),
                         float(cells[8].split()[0])))
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = read_rows(sys.argv[2])
    if not rows:
        sys.exit("no sparse_bench rows in " + sys.argv[2])
    lengths = sorted({r[0] for r in rows})
    fig, axes = plt.subplots(1, len(lengths), figsize=(6 * len(lengths), 4.5),
                             squeeze=False)
    for ax, n in zip(axes[0], lengths):
        mine = [r for r in rows if r[0] == n]
        fractions = sorted({r[3] for r in mine})
        ax.plot(fractions, [1 / f for f in fractions], "k:",
                label="ideal: 1 / fraction")
        for mask, marker in (("dense", "o"), ("causal", "s")):
            part = [r for r in mine if r[1] == mask]
            ax.scatter([r[3] for r in part], [r[4] / r[5] for r in part],
                       marker=marker, color="tab:blue",
                       label=f"one launch, our kernel ({mask})")
            ax.scatter([r[3] for r in part], [r[4] / r[6] for r in part],
                       marker=marker, facecolors="none", color="tab:orange",
                       label=f"cuDNN per rectangle ({mask})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = [0.03, 0.05, 0.1, 0.25, 0.5]
        ax.set_xticks(ticks, [f"{t:.0%}" for t in ticks])
        ax.set_xticks([], minor=True)
        ax.set_yticks([2, 4, 8, 16, 32], ["2x", "4x", "8x", "16x", "32x"])
        ax.set_yticks([], minor=True)
        ax.set_xlabel("fraction of dense's (query, key) pairs computed")
        ax.set_ylabel("speedup over dense (cuDNN)")
        ax.set_title(f"block-sparse, N = {n // 1024}K, blocks of 1024")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
