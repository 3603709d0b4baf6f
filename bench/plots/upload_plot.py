"""Draws where a resident context upload's time goes on the worker.

Usage: python3 bench/plots/upload_plot.py OUT.png PHASES.csv
e.g.   python3 bench/plots/upload_plot.py docs/context_upload_h200.png \\
           docs/results/h200-s23-upload-phases.csv

Reads one row per upload (columns path, upload_on_pair, arrived_s, stored_s:
the worker's log line "rows arrived in A s, stored in S s") and draws, per
path and whether the upload was the first one a fresh coordinator and worker
took ("first") or a later one ("warm"), the median time the rows took to
arrive and to be stored on the device as stacked bars, with every upload's
total as a dot. Needs matplotlib.
"""
import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_groups(path):
    groups = {}  # (path, upload_on_pair) -> [(arrived, stored)], in file order
    with open(path, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            key = (row["path"], row["upload_on_pair"])
            groups.setdefault(key, []).append(
                (float(row["arrived_s"]), float(row["stored_s"])))
    return groups


def main(out_png, csv_path):
    groups = read_groups(csv_path)
    labels = [f"{path}, {when}" for path, when in groups]
    arrived = [statistics.median(a for a, _ in v) for v in groups.values()]
    stored = [statistics.median(s for _, s in v) for v in groups.values()]
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(labels) + 1.6))
    rows = range(len(labels))
    ax.barh(rows, arrived, color="#4c72b0", label="rows arriving (median)")
    ax.barh(rows, stored, left=arrived, color="#dd8452",
            label="stored on the device (median)")
    for i, uploads in enumerate(groups.values()):
        ax.plot([a + s for a, s in uploads], [i] * len(uploads), "k.",
                markersize=4, label="each upload's total" if i == 0 else None)
    ax.set_yticks(list(rows))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds on the worker")
    ax.set_title("A 4M-token context (17.45 GB, bf16) into one H200 worker")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
