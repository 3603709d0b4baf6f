"""Prints the closing line of `./dev test` from Bazel's test summary and GoogleTest XML.

Arguments: a file holding Bazel's console output of `bazel test`, then any number of
LABEL=PATH pairs naming further JUnit XML files (the Python tests). For every test
target Bazel reported, and every extra file, counts test cases as passed, failed or
skipped (printing each distinct skip reason once); a target that failed without saying
which case (it did not build, crashed, or timed out), or an extra file that is missing,
counts as one failure. Exits 1 if anything failed.
"""
import glob
import os
import re
import sys
import xml.etree.ElementTree as ElementTree

EXTRA_XML = {}
SUMMARY = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?([A-Z][A-Z ]*[A-Z])\b")


def xml_files(target):
    if target in EXTRA_XML:
        return [EXTRA_XML[target]] if os.path.exists(EXTRA_XML[target]) else []
    package, name = target[2:].split(":")
    root = os.path.join("bazel-testlogs", package, name)
    return glob.glob(os.path.join(root, "test.xml")) + glob.glob(
        os.path.join(root, "shard_*", "test.xml"))


def count_cases(target):
    """(passed, failed, skipped) over the target's GoogleTest cases; prints failures,
    and skips once per distinct reason."""
    passed = failed = skipped = 0
    skip_reasons = {}
    for path in xml_files(target):
        try:
            cases = list(ElementTree.parse(path).iter("testcase"))
        except ElementTree.ParseError:
            continue
        for case in cases:
            name = f"{target} {case.get('classname')}.{case.get('name')}"
            skip = case.find("skipped")
            if case.find("failure") is not None or case.find("error") is not None:
                print(f"FAILED {name}")
                failed += 1
            elif skip is not None or case.get("result") == "skipped":
                reason = skip.get("message", "") if skip is not None else ""
                reason = (reason.strip().splitlines() or [""])[-1]
                skip_reasons[reason] = skip_reasons.get(reason, 0) + 1
                skipped += 1
            else:
                passed += 1
    for reason, count in skip_reasons.items():
        cases = "case" if count == 1 else "cases"
        print(f"SKIPPED {target}: {count} {cases}: {reason}")
    return passed, failed, skipped


def main(log_path, extras):
    passed = failed = skipped = 0
    with open(log_path, encoding="utf-8", errors="replace") as log:
        statuses = [m.groups() for m in map(SUMMARY.match, log) if m]
    for extra in extras:
        label, path = extra.split("=", 1)
        EXTRA_XML[label] = path
        statuses.append((label, "PASSED" if os.path.exists(path) else "NO RESULTS"))
    for target, status in statuses:
        p, f, s = count_cases(target) if status in ("PASSED", "FAILED", "FLAKY") else (0, 0, 0)
        if status not in ("PASSED", "FLAKY") and f == 0:
            print(f"FAILED {target}: {status.lower()}")
            f = 1
        passed, failed, skipped = passed + p, failed + f, skipped + s
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or not statuses else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
