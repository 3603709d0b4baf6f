"""Draws the block kernel against PyTorch's SDPA: TFLOP/s of our Hopper kernel,
PyTorch's cuDNN and flash backends, per sequence length and mask, one panel
per head dim.

Usage: python3 bench/plots/kernel_plot.py OUT.png RESULTS.md:D [RESULTS.md:D ...]
e.g.   python3 bench/plots/kernel_plot.py docs/block_kernel_h200.png \\
           docs/results/h200-s34.md:128 docs/results/h200-s35.md:64

Each RESULTS.md:D names a results file and the head dim to take from it: the
first table gpu_attention_bench printed after a line that says "D=<D>" (its
"our Hopper kernel" column) and the next table peer_sdpa.py printed in that
run ("SDPA cuDNN", "SDPA flash"). Needs matplotlib.
"""
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OURS = "our Hopper kernel"
PEERS = ("SDPA cuDNN", "SDPA flash")


def tables_of(path):
    """[(head dim of the last line naming one, header, rows)] of each table."""
    tables = []
    head_dim = None
    with open(path) as f:
        lines = [line.strip() for line in f]
    i = 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            m = re.search(r"\bD=(\d+)\b", lines[i])
            if m:
                head_dim = int(m.group(1))
            i += 1
            continue
        block = []
        while i < len(lines) and lines[i].startswith("|"):
            block.append([c.strip() for c in lines[i].strip("|").split("|")])
            i += 1
        rows = [r for r in block[1:] if not r[0].startswith("---")]
        tables.append((head_dim, block[0], rows))
    return tables


def read_tables(path, head_dim):
    """{column: {(n, mask): TFLOP/s}} for OURS and PEERS, from the first table
    with OURS at head_dim and the next with PEERS."""
    found = {}
    for dim, header, rows in tables_of(path):
        if dim != head_dim or header[:2] != ["N", "mask"]:
            continue
        wanted = (OURS,) if OURS not in found else PEERS
        if not all(column in header for column in wanted):
            continue
        for column in wanted:
            index = header.index(column)
            found[column] = {(int(r[0]), r[1]): float(r[index]) for r in rows}
        if wanted == PEERS:
            return found
    sys.exit("%s: no D=%d table of %s followed by one of %s" %
             (path, head_dim, OURS, ", ".join(PEERS)))


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    panels = []
    for spec in argv[2:]:
        path, _, dim = spec.rpartition(":")
        panels.append((int(dim), os.path.basename(path),
                       read_tables(path, int(dim))))
    figure, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2),
                                squeeze=False)
    series = [(OURS, "ringattn (our Hopper kernel)", "tab:blue"),
              ("SDPA cuDNN", "PyTorch SDPA, cuDNN", "tab:orange"),
              ("SDPA flash", "PyTorch SDPA, flash", "tab:gray")]
    for axis, (dim, source, tables) in zip(axes[0], panels):
        cases = sorted(tables[OURS], key=lambda k: (k[0], k[1] != "dense"))
        width = 0.8 / len(series)
        for i, (column, label, color) in enumerate(series):
            values = [tables[column].get(case, 0.0) for case in cases]
            xs = [x + (i - 1) * width for x in range(len(cases))]
            bars = axis.bar(xs, values, width, label=label, color=color)
            if column == OURS:
                for bar, value in zip(bars, values):
                    axis.annotate("%.0f" % value, (bar.get_x() + width / 2, value),
                                  ha="center", va="bottom", fontsize=7)
        axis.set_xticks(range(len(cases)))
        axis.set_xticklabels(["%dK\n%s" % (n // 1024, mask) for n, mask in cases],
                             fontsize=8)
        axis.set_ylabel("TFLOP/s")
        top = max(max(tables[column].values()) for column, _, _ in series)
        axis.set_ylim(0, top * 1.2)
        axis.set_title("D=%d, bf16, 32 heads, one H200 (%s)" % (dim, source))
        axis.legend(fontsize=8, loc="upper center", ncol=3)
    figure.tight_layout()
    figure.savefig(argv[1], dpi=110)


if __name__ == "__main__":
    main(sys.argv)
