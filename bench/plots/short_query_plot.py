"""Draws how queries of a resident context scale from one GPU to two.

Usage: python3 bench/plots/short_query_plot.py OUT.png TABLES.md
e.g.   python3 bench/plots/short_query_plot.py docs/short_queries_4m_s28.png \\
           docs/results/h200x2-s28.md

Reads the query tables of bench/service/service_bench --query_rows under the
headings "## 1 GPU" and "## 2 GPUs" (as resident_plot.py reads them) and
draws, against query rows: the two GPUs' end-to-end p50 and GPU time as
fractions of one GPU's, beside the 0.6 the short-query issue asks for; and
the share of each end to end spent outside the GPUs. Needs matplotlib.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from resident_plot import read_queries  # noqa: E402


def by_rows(rows, title):
    """{query rows: (p50 ms, GPU ms)} of the table under `title`."""
    found = [entries for (t, _), entries in rows.items() if t == title]
    if len(found) != 1:
        sys.exit(f"expected one context's table under '## {title}'")
    return {q: (p50, gpu) for q, p50, gpu in found[0]}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = read_queries(sys.argv[2])
    one = by_rows(rows, "1 GPU")
    two = by_rows(rows, "2 GPUs")
    sizes = sorted(set(one) & set(two))
    fig, (ratio, outside) = plt.subplots(1, 2, figsize=(10, 4))
    ratio.plot(sizes, [two[q][0] / one[q][0] for q in sizes], "o-",
               label="end to end (p50)")
    ratio.plot(sizes, [two[q][1] / one[q][1] for q in sizes], "s--",
               label="GPU time (slowest worker)")
    ratio.axhline(0.6, color="gray", linestyle=":", label="target 0.6")
    ratio.set_ylabel("2 GPUs / 1 GPU")
    ratio.set_ylim(0.4, 0.8)
    ratio.set_title("two GPUs against one")
    for label, table in (("1 GPU", one), ("2 GPUs", two)):
        outside.plot(sizes, [100 * (1 - table[q][1] / table[q][0])
                             for q in sizes], "o-", label=label)
    outside.axhline(10, color="gray", linestyle=":", label="10%")
    outside.set_ylabel("% of end to end outside the GPUs")
    outside.set_title("where the time goes")
    for ax in (ratio, outside):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("query rows")
        ax.legend(fontsize=8)
    fig.suptitle("Queries of a 4M-token resident context through the service, "
                 "Hq=32 Hkv=8 D=128 bf16, 2x H200")
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
