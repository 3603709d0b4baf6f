"""Draws where a resident-context query's time outside the GPU goes.

Usage: python3 bench/plots/query_phases_plot.py OUT.png RESULTS.md HEADING
e.g.   python3 bench/plots/query_phases_plot.py docs/query_phases_4m_s31.png \\
           docs/results/h200-s31.md "## E."

Reads the phase table (bench/service/query_phases.py's output) in the section of
RESULTS.md whose heading starts with HEADING, takes for each side (the run
names' last letter: a, b) and query size the median over its rounds of each
phase, and draws them as stacked bars, a side beside b, one pair per size, with
the GPU's own time written above. Needs matplotlib.
"""
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Phases outside the GPU, in the order a query meets them, and their labels.
SEGMENTS = [
    (("to coord",), "client to coordinator"),
    (("to worker", "header"), "coordinator to worker, header"),
    (("rows",), "query rows arriving"),
    (("around",), "copies and launches"),
    (("out",), "output handed out"),
    (("coord done",), "coordinator forwarding"),
    (("back",), "back to the client"),
]


def read_phases(path, heading):
    """{(side, rows): {phase: [ms per round]}} from the section's table."""
    header, phases, inside = None, {}, False
    for line in open(path):
        if line.startswith("## "):
            inside = line.startswith(heading)
            continue
        if not inside or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:2] == ["run", "rows"]:
            header = cells
            continue
        if header is None or not cells[1].isdigit():
            continue
        side = cells[0][-1]
        entry = phases.setdefault((side, int(cells[1])), {})
        for name, value in zip(header[3:], cells[3:]):
            entry.setdefault(name, []).append(float(value))
    return phases


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    phases = read_phases(sys.argv[2], sys.argv[3])
    if not phases:
        sys.exit(f"no phase table under {sys.argv[3]!r} in {sys.argv[2]}")
    sizes = sorted({rows for _, rows in phases})
    sides = sorted({side for side, _ in phases})
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = plt.cm.tab10.colors
    width = 0.8 / len(sides)
    for s, side in enumerate(sides):
        for i, rows in enumerate(sizes):
            entry = phases.get((side, rows))
            if entry is None:
                continue
            x = i + (s - (len(sides) - 1) / 2) * width
            bottom = 0.0
            for k, (names, label) in enumerate(SEGMENTS):
                ms = sum(statistics.median(entry[n]) for n in names)
                ax.bar(x, ms, width * 0.9, bottom=bottom, color=colors[k],
                       label=label if s == 0 and i == 0 else None)
                bottom += ms
            ax.text(x, bottom + 0.05, f"{side}\n{statistics.median(entry['gpu']):.1f}",
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([str(r) for r in sizes])
    ax.set_xlabel("query rows (above each bar: its side, and the GPU's ms)")
    ax.set_ylabel("ms outside the GPU (medians of the rounds)")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Where a query's time outside the GPU goes", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=120)


if __name__ == "__main__":
    main()
