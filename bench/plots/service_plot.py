"""Draws where the time of one-shot requests through the service goes.

Usage: python3 bench/plots/service_plot.py OUT.png TABLE.md
e.g.   python3 bench/plots/service_plot.py docs/service_2gpu_time.png \\
           docs/results/h200x2-service.md

Reads the markdown tables bench/service/service_bench prints (columns N, end to
end s, workers' compute s, ...; a file may hold several, each under a "## "
heading that names it) and draws, per table and N, the workers' compute time
and the rest of the end-to-end time (upload, routing, download) as stacked
bars, one panel per N. Needs matplotlib.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_tables(path):
    tables = []  # (title, [(n, end_to_end, compute)])
    title = None
    header = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                title = line[3:].split(":")[0].split("(")[0].strip()
                header = None
                continue
            if not line.startswith("|") or line.startswith("| ---"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if "end to end s" in cells:
                header = cells
                tables.append((title, []))
                continue
            if header is None or len(cells) < len(header):
                continue
            row = dict(zip(header, cells))
            tables[-1][1].append((int(row["N"]), float(row["end to end s"]),
                                  float(row["workers' compute s"])))
    return tables


def label(n):
    return "%dM" % (n >> 20) if n >= 1 << 20 else "%dK" % (n >> 10)


def main():
    out, path = sys.argv[1], sys.argv[2]
    tables = read_tables(path)
    lengths = sorted({n for _, rows in tables for n, _, _ in rows})
    fig, axes = plt.subplots(1, len(lengths), figsize=(3 * len(lengths), 4))
    for ax, n in zip(axes, lengths):
        names, compute, rest = [], [], []
        for title, rows in tables:
            for m, total, busy in rows:
                if m == n:
                    names.append(title)
                    compute.append(busy)
                    rest.append(total - busy)
        xs = range(len(names))
        ax.bar(xs, compute, color="C0", label="GPU compute")
        ax.bar(xs, rest, bottom=compute, color="C1",
               label="upload, routing, download")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, fontsize=8, rotation=20, ha="right")
        ax.set_title("%s tokens" % label(n))
        ax.set_ylabel("seconds, end to end")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("One-shot causal requests through the service, 2x H200 "
                 "(32 heads, D=128, bf16)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
