#!/usr/bin/env python3
"""Checks a rendered k8s overlay against the binaries it runs.

    k8s_drift_check.py RENDERED.yaml BIN_DIR

For every container of the coordinator Deployment and the worker StatefulSet:
every --flag in its args is a flag of its binary (BIN_DIR/ringattn-coordinator
or ringattn-worker, per `--helpfull`); the ports the flags name (after the
ConfigMap's values are substituted) are the containerPorts; gRPC probes and
Services point at the gRPC port, HTTP probes at the --http_port, on a path the
binary serves. Exits 1 naming every mismatch, so manifests and binaries cannot
drift apart.
"""
import re
import subprocess
import sys

import yaml

BINARIES = {"coordinator": "ringattn-coordinator", "worker": "ringattn-worker"}
HTTP_PATHS = ("/healthz", "/readyz", "/metrics")


def binary_flags(path):
    text = subprocess.run([path, "--helpfull"], capture_output=True,
                          text=True).stdout
    return set(re.findall(r"^\s+--([a-z_0-9]+) ", text, re.M))


def substitute(value, env):
    return re.sub(r"\$\(([A-Z_0-9]+)\)", lambda m: env.get(m.group(1), m.group(0)),
                  value)


def main():
    documents = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
    bin_dir = sys.argv[2]
    config = {}
    for d in documents:
        if d["kind"] == "ConfigMap":
            config.update(d.get("data", {}))
    problems = []
    grpc_ports = {}  # component -> port
    for d in documents:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for container in d["spec"]["template"]["spec"]["containers"]:
            name = container["name"]
            where = "%s %s container %s" % (d["kind"], d["metadata"]["name"], name)
            if name not in BINARIES:
                problems.append("%s: no binary known for it" % where)
                continue
            binary = "%s/%s" % (bin_dir, BINARIES[name])
            flags = binary_flags(binary)
            env = dict(config)
            for var in container.get("env", []):
                if "value" in var:
                    env[var["name"]] = var["value"]
            values = {}
            for arg in container.get("args", []):
                match = re.match(r"--([a-z_0-9]+)(=(.*))?$", arg)
                if not match:
                    problems.append("%s: argument %r is not a --flag" % (where, arg))
                    continue
                if match.group(1) not in flags:
                    problems.append("%s: %s has no flag --%s" %
                                    (where, BINARIES[name], match.group(1)))
                values[match.group(1)] = substitute(match.group(3) or "", env)
            ports = {p.get("name"): p["containerPort"]
                     for p in container.get("ports", [])}
            grpc = values.get("port")
            http = values.get("http_port")
            if grpc is None or not grpc.isdigit():
                problems.append("%s: --port is not set to a number (%r)" % (where, grpc))
                continue
            grpc_ports[name] = int(grpc)
            if ports.get("grpc") != int(grpc):
                problems.append("%s: containerPort grpc %s != --port %s" %
                                (where, ports.get("grpc"), grpc))
            if http is not None and ports.get("http") != int(http):
                problems.append("%s: containerPort http %s != --http_port %s" %
                                (where, ports.get("http"), http))
            for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
                probe = container.get(kind)
                if not probe:
                    continue
                if "grpc" in probe and probe["grpc"]["port"] != int(grpc):
                    problems.append("%s: %s gRPC port %s != --port %s" %
                                    (where, kind, probe["grpc"]["port"], grpc))
                if "httpGet" in probe:
                    port = probe["httpGet"]["port"]
                    port = ports.get(port, port)
                    if http is None or port != int(http):
                        problems.append("%s: %s HTTP port %s != --http_port %s" %
                                        (where, kind, port, http))
                    path = probe["httpGet"]["path"]
                    if path not in HTTP_PATHS or path.encode() not in open(binary, "rb").read():
                        problems.append("%s: %s path %s is not served by %s" %
                                        (where, kind, path, BINARIES[name]))
    for d in documents:
        if d["kind"] != "Service":
            continue
        component = d["spec"].get("selector", {}).get("app.kubernetes.io/component")
        for port in d["spec"]["ports"]:
            if port.get("name") == "grpc" and component in grpc_ports:
                target = port.get("targetPort", port["port"])
                if target not in (grpc_ports[component], "grpc"):
                    problems.append("Service %s: gRPC targetPort %s != --port %s" %
                                    (d["metadata"]["name"], target, grpc_ports[component]))
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("every flag, port and probe matches the binaries")


if __name__ == "__main__":
    main()
