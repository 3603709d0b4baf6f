"""Draws the share of a query's end-to-end time spent outside the GPUs.

Usage: python3 bench/plots/query_overhead_plot.py OUT.png TABLES.md
e.g.   python3 bench/plots/query_overhead_plot.py docs/query_overhead_4m_s30.png \\
           docs/results/h200-s30.md

Reads the query tables of bench/service/service_bench --query_rows, each under
a "## " heading that names it (as resident_plot.py reads them), and draws, per
table, 1 - GPU time / end-to-end p50 against query rows, beside the 10% the
scale issue asks for. Needs matplotlib.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from resident_plot import read_queries  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = read_queries(sys.argv[2])
    if not rows:
        sys.exit(f"no query tables in {sys.argv[2]}")
    fig, ax = plt.subplots(figsize=(6, 4))
    for (title, _), entries in sorted(rows.items()):
        entries = sorted(entries)
        ax.plot([q for q, _, _ in entries],
                [100 * (1 - gpu / p50) for _, p50, gpu in entries], "o-",
                label=title)
    ax.axhline(10, color="gray", linestyle=":", label="10%")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("query rows")
    ax.set_ylabel("% of end to end outside the GPU")
    ax.legend(fontsize=8)
    context = sorted({n for _, n in rows})
    ax.set_title(f"Queries of a {context[0] / 2**20:.0f}M-token resident "
                 "context, Hq=32 Hkv=8 D=128 bf16, one H200", fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
