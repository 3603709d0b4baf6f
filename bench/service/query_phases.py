#!/usr/bin/env python3
"""Where a resident-context query's time goes, from the logs of one host.

    bench/service/query_phases.py DIR [NAME ...]

DIR holds what bench/service/query_ab.sh writes for each run NAME:
NAME.coordinator.log, NAME.worker0.log and NAME.err (service_bench's stderr,
run with --query_timeline). The processes stamp their lines with the same
clock, so one query's lines join by its request id into a timeline; this
prints, per run and query size, the median of each phase in milliseconds:

  to coord   the client began the query .. the coordinator opened the
             worker streams and logged "uploading"
  to worker  .. the worker's stream opened (its header line says how long
             before it was accepted)
  header     .. the worker accepted the header (its executor made)
  rows       .. all query rows had arrived
  around     .. computed, less the GPU's own time (copies, launches)
  gpu        the GPU's time (the worker's "s computing")
  out        computed .. the worker's last output message was handed to gRPC
  first out  that message handed out .. the client took its first output
             (negative: earlier messages came sooner)
  coord done that message handed out .. the coordinator logged "done"
  back       the coordinator done .. the client was done
  total      the client began .. was done
"""

import datetime
import glob
import os
import re
import statistics
import sys

STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\]"
TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"


def seconds(stamp):
    return datetime.datetime.strptime(stamp, TIME_FORMAT).timestamp()


def matches(path, line_re):
    """The matches of `line_re` in the lines of `path` (none if it is absent)."""
    if not os.path.exists(path):
        return
    with open(path, errors="replace") as f:
        for line in f:
            m = line_re.search(line.rstrip("\n"))
            if m:
                yield m


def client_timeline(path):
    """request id -> (rows, began, first output or None, done)."""
    line_re = re.compile(
        r"timeline: request (\S+): (\d+) rows; began ([\d\- :.]+), "
        r"first output ([\d\- :.]+|-), done ([\d\- :.]+)$")
    queries = {}
    for m in matches(path, line_re):
        first = None if m.group(4) == "-" else seconds(m.group(4))
        queries[m.group(1)] = (int(m.group(2)), seconds(m.group(3)), first,
                               seconds(m.group(5)))
    return queries


def coordinator_events(path):
    """request id -> {"uploading": t, "done": t}."""
    line_re = re.compile(STAMP + r" \[info\] request (\S+): .*?(uploading|done in)")
    events = {}
    for m in matches(path, line_re):
        key = "uploading" if m.group(3) == "uploading" else "done"
        events.setdefault(m.group(2), {})[key] = seconds(m.group(1))
    return events


def worker_events(path):
    """request id -> {"opened", "header", "rows", "computed", "gpu", "out"}."""
    line_re = re.compile(STAMP + r" \[info\] request (\S+) rank 0/\d+: (.*)$")
    events = {}
    for m in matches(path, line_re):
        t, request, text = seconds(m.group(1)), m.group(2), m.group(3)
        e = events.setdefault(request, {})
        if text.startswith("header"):
            opened = re.search(r"([\d.]+) ms after the stream opened", text)
            e["header"] = t
            if opened:
                e["opened"] = t - float(opened.group(1)) / 1e3
        elif text.startswith("all rows arrived"):
            e["rows"] = t
        elif text.startswith("computed"):
            e["computed"] = t
            gpu = re.search(r"([\d.e+-]+) s computing", text)
            if gpu:
                e["gpu"] = float(gpu.group(1))
        elif text.startswith("output handed out"):
            e["out"] = t
    return events


PHASES = ["to coord", "to worker", "header", "rows", "around", "gpu", "out",
          "first out", "coord done", "back", "total"]


def phases(client, coordinator, worker):
    _, began, first, done = client
    c, w = coordinator, worker
    needed = ["opened", "header", "rows", "computed", "gpu", "out"]
    if "uploading" not in c or "done" not in c or any(k not in w for k in needed):
        return None
    return {
        "to coord": c["uploading"] - began,
        "to worker": w["opened"] - c["uploading"],
        "header": w["header"] - w["opened"],
        "rows": w["rows"] - w["header"],
        "around": w["computed"] - w["rows"] - w["gpu"],
        "gpu": w["gpu"],
        "out": w["out"] - w["computed"],
        "first out": (first - w["out"]) if first is not None else float("nan"),
        "coord done": c["done"] - w["out"],
        "back": done - c["done"],
        "total": done - began,
    }


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    names = sys.argv[2:] or sorted(
        os.path.basename(p)[: -len(".coordinator.log")]
        for p in glob.glob(os.path.join(directory, "*.coordinator.log")))
    print("| run | rows | queries | " + " | ".join(PHASES) + " |")
    print("| --- " * (len(PHASES) + 3) + "|")
    for name in names:
        base = os.path.join(directory, name)
        clients = client_timeline(base + ".err")
        coordinator = coordinator_events(base + ".coordinator.log")
        worker = worker_events(base + ".worker0.log")
        by_rows = {}
        for request, client in clients.items():
            p = phases(client, coordinator.get(request, {}),
                       worker.get(request, {}))
            if p is not None:
                by_rows.setdefault(client[0], []).append(p)
        for rows in sorted(by_rows):
            runs = by_rows[rows]
            cells = [f"{1e3 * statistics.median(r[k] for r in runs):.3f}"
                     for k in PHASES]
            print(f"| {name} | {rows} | {len(runs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
