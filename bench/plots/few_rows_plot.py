"""Draws few query rows against a long K/V block: ours and PyTorch's best, as
multiples of the floor, against the number of query rows.

Usage: python3 bench/plots/few_rows_plot.py OUT.png TABLE.md
e.g.   python3 bench/plots/few_rows_plot.py docs/few_rows_h200.png \\
           docs/results/h200x2-few-rows-s7.md

Reads the first table of the summary peer_decode.py prints (columns Nk, Nq,
ours (path), ringattn cuDNN, floor, ours / floor, best PyTorch (backend),
PyTorch / ours; Nk written as 1M, 4M or a number) and draws one panel per Nk
with bars of ours / floor and best PyTorch / floor per Nq, the floor at 1 and
the issue's target at 1.25. Needs matplotlib.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def tokens(text):
    """1M -> 1048576, 4M -> 4194304, digits as they are."""
    if text.endswith("M"):
        return int(text[:-1]) << 20
    return int(text)


def read_rows(path):
    """[(nk, nq, ours ms, ours path, floor ms, PyTorch ms, PyTorch backend)] of
    the first summary table in the file."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 8 or not cells[1].isdigit():
                if rows:
                    break
                continue
            ours, path_name = cells[2].split(" ", 1)
            best, backend = cells[6].split(" ", 1)
            rows.append((tokens(cells[0]), int(cells[1]), float(ours),
                         path_name.strip("()"), float(cells[4]), float(best),
                         backend.strip("()")))
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out, table = sys.argv[1], sys.argv[2]
    rows = read_rows(table)
    if not rows:
        sys.exit(f"no summary table in {table}")
    lengths = sorted({r[0] for r in rows})
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4.2),
                             sharey=True, squeeze=False)
    for axis, nk in zip(axes[0], lengths):
        mine = [r for r in rows if r[0] == nk]
        x = range(len(mine))
        axis.bar([i - 0.2 for i in x], [r[2] / r[4] for r in mine], 0.4,
                 label="ringattn (dispatcher's path)", color="tab:blue")
        axis.bar([i + 0.2 for i in x], [r[5] / r[4] for r in mine], 0.4,
                 label="best PyTorch SDPA backend", color="tab:gray")
        for i, r in zip(x, mine):
            axis.annotate(r[3], (i - 0.2, r[2] / r[4]), ha="center",
                          va="bottom", fontsize=7)
            axis.annotate(r[6].replace("SDPA ", ""), (i + 0.2, r[5] / r[4]),
                          ha="center", va="bottom", fontsize=7)
        axis.axhline(1.0, color="black", linewidth=0.8, label="floor")
        axis.axhline(1.25, color="tab:red", linewidth=0.8, linestyle="--",
                     label="target (1.25x the floor)")
        axis.set_xticks(list(x))
        axis.set_xticklabels([str(r[1]) for r in mine])
        axis.set_xlabel("query rows")
        axis.set_title(f"{nk >> 20}M keys")
        axis.set_yscale("log")
        ticks = [1, 1.25, 1.5, 2, 3, 4]
        axis.set_yticks(ticks)
        axis.set_yticklabels([f"{t:g}x" for t in ticks])
        axis.minorticks_off()
    axes[0][0].set_ylabel("time / floor (log)")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Few query rows against a long context, one H200 "
                 "(bf16, Hq=32, Hkv=8, D=128)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
