#!/usr/bin/env python3
"""Standard-library helper of deploy/test_containers.sh: writes small random Q, K, V as
.npy float32 [N, H, D] and checks an O.npy from the service against a float64 reference
of softmax(Q K^T * scale [+ causal mask]) V, computed here densely.

  npy_check.py gen DIR N H D SEED      writes DIR/q.npy DIR/k.npy DIR/v.npy
  npy_check.py check DIR OUT.npy [--causal] [--tol T]
"""
import argparse
import ast
import math
import os
import random
import struct
import sys


def write_npy(path, shape, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % (tuple(shape),)
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%df" % len(values), *values))


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(path + ": not an .npy file")
    major = data[6]
    if major == 1:
        hlen, start = struct.unpack("<H", data[8:10])[0], 10
    else:
        hlen, start = struct.unpack("<I", data[8:12])[0], 12
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    if header["descr"] != "<f4" or header["fortran_order"]:
        raise ValueError(path + ": expected C-order float32, got %r" % (header,))
    shape = tuple(header["shape"])
    count = math.prod(shape)
    body = data[start + hlen:]
    return shape, list(struct.unpack("<%df" % count, body[:4 * count]))


def gen(args):
    rng = random.Random(args.seed)
    shape = (args.n, args.h, args.d)
    for name in "qkv":
        values = [rng.uniform(-1.0, 1.0) for _ in range(math.prod(shape))]
        write_npy(os.path.join(args.dir, name + ".npy"), shape, values)
    return 0


def check(args):
    (n, h, d), q = read_npy(os.path.join(args.dir, "q.npy"))
    _, k = read_npy(os.path.join(args.dir, "k.npy"))
    _, v = read_npy(os.path.join(args.dir, "v.npy"))
    out_shape, o = read_npy(args.out)
    if out_shape != (n, h, d):
        print("O has shape %s, expected %s" % (out_shape, (n, h, d)))
        return 1
    scale = float(struct.unpack("<f", struct.pack("<f", 1.0 / math.sqrt(d)))[0])
    at = lambda t, i, hh: t[(i * h + hh) * d:(i * h + hh + 1) * d]
    worst = 0.0
    for hh in range(h):
        for i in range(n):
            qi = at(q, i, hh)
            keys = range(i + 1) if args.causal else range(n)
            logits = [scale * sum(a * b for a, b in zip(qi, at(k, j, hh))) for j in keys]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            for c in range(d):
                ref = sum(w * at(v, j, hh)[c] for w, j in zip(weights, keys)) / total
                worst = max(worst, abs(ref - at(o, i, hh)[c]))
    print("max |O - reference| = %.3g (tolerance %g)" % (worst, args.tol))
    return 0 if worst <= args.tol else 1


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gen")
    g.add_argument("dir")
    g.add_argument("n", type=int)
    g.add_argument("h", type=int)
    g.add_argument("d", type=int)
    g.add_argument("seed", type=int)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("out")
    c.add_argument("--causal", action="store_true")
    c.add_argument("--tol", type=float, default=1e-4)
    args = parser.parse_args()
    return gen(args) if args.command == "gen" else check(args)


if __name__ == "__main__":
    sys.exit(main())
