#!/usr/bin/env python3
"""Checks deploy/grafana/ringattn-dashboard.json against a running coordinator.

    check_dashboard.py DASHBOARD.json METRICS_URL

Every metric family a panel queries must be one the coordinator exports (its
/metrics page declares every family at start), and every family it exports must
appear on some panel, so the dashboard and the binary cannot drift apart.
Exits 1 naming what is missing.
"""
import json
import re
import sys
import urllib.request


def queried_families(dashboard):
    names = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in re.findall(r"\bringattn_[a-z_]+", target["expr"]):
                names.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return names


def exported_families(url):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return set(re.findall(r"^# TYPE (ringattn_[a-z_]+) ", text, re.M))


def main():
    dashboard = json.load(open(sys.argv[1]))
    queried = queried_families(dashboard)
    exported = exported_families(sys.argv[2])
    problems = []
    for name in sorted(queried - exported):
        problems.append("the dashboard queries %s, which the coordinator does not export" % name)
    for name in sorted(exported - queried):
        problems.append("the coordinator exports %s, which no panel shows" % name)
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("%d metric families, all on the dashboard and all exported" % len(exported))


if __name__ == "__main__":
    main()
