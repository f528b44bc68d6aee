#!/usr/bin/env python3
"""How many probed rows a first pass over RaBitQ's sign plane would leave.

The GPU paper's form of RaBitQ reads each probed row's 1-bit code (the sign
plane, with correction factors of its own) first, and the extra bits only
for the rows whose 1-bit bound cannot rule out. This measures that share on
real or synthetic data, in float64 with numpy (no index involved): k-means
lists, a Haar-random rotation P, and for each query and each row of its
nprobe nearest lists the 1-bit estimate of <r, q - c> (r = o - c) and its
bound (eps0 times ||r|| ||q - c|| sqrt(1 - a^2) / (a sqrt(d - 1)), a =
<sign(P r) / sqrt(d), P r / ||r||>), hence a lower bound of the squared L2
distance. A row survives when that lower bound is at most a threshold:
the k-th smallest exact distance among the probed rows (what a pass that
knew the answer would keep), or the k-th smallest 1-bit upper bound (a
threshold the first pass can compute itself, and safe where the bounds
hold).

usage: sign_plane.py fashion            (Fashion-MNIST, Debian's dataset-fashion-mnist)
       sign_plane.py text FILE N M      (FILE: one vector a line, space-separated;
                                          the first N rows the base, the next M the queries)
"""
import gzip
import sys

import numpy as np

rng = np.random.default_rng(7)


def fashion():
    root = '/usr/share/datasets/fashion-mnist/'
    with gzip.open(root + 'train-images-idx3-ubyte.gz') as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float64)
    with gzip.open(root + 't10k-images-idx3-ubyte.gz') as f:
        q = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float64)
    return 'Fashion-MNIST', x, q[:200], 256, 16


def text(path, n, m):
    x = np.loadtxt(path, dtype=np.float64, max_rows=n + m)
    return path, x[:n], x[n:n + m], max(1, n // 200), 8


def kmeans(x, lists, iters=8):
    c = x[rng.choice(len(x), lists, replace=False)].copy()
    for _ in range(iters + 1):
        a = ((x * x).sum(1)[:, None] - 2 * x @ c.T + (c * c).sum(1)[None, :]).argmin(1)
        if _ == iters:
            return c, a
        for j in range(lists):
            members = x[a == j]
            if len(members):
                c[j] = members.mean(0)


def run(name, x, q, lists, nprobe):
    n, d = x.shape
    c, a = kmeans(x, lists)
    P, _ = np.linalg.qr(rng.standard_normal((d, d)))
    r = x - c[a]
    nr = np.linalg.norm(r, axis=1)
    u = (r / np.maximum(nr, 1e-30)[:, None]) @ P.T
    s = np.where(u >= 0, 1.0, -1.0)
    al = np.abs(u).sum(1) / np.sqrt(d)
    print(f"# {name}: {n} x {d}, {lists} lists, nprobe {nprobe}, {len(q)} queries")
    print("| eps0 | k | probed rows a query | left, k-th exact distance | left, k-th 1-bit upper bound |")
    print("|---|---|---|---|---|")
    for eps0 in (1.9, 3.0):
        for k in (10, 100):
            kept_exact = kept_upper = total = 0
            for qi in q:
                probes = np.argsort(((c - qi) ** 2).sum(1))[:nprobe]
                rows = np.nonzero(np.isin(a, probes))[0]
                qr = qi - c[a[rows]]
                nq = np.linalg.norm(qr, axis=1)
                est = (s[rows] * (qr @ P.T)).sum(1) / np.sqrt(d) / al[rows] * nr[rows]
                err = nr[rows] * nq * np.sqrt(np.maximum(1 - al[rows] ** 2, 0)) / (al[rows] * np.sqrt(d - 1)) * eps0
                base = nr[rows] ** 2 + nq ** 2
                lower, upper = base - 2 * (est + err), base - 2 * (est - err)
                kk = min(k, len(rows)) - 1
                exact = ((x[rows] - qi) ** 2).sum(1)
                kept_exact += int((lower <= np.partition(exact, kk)[kk]).sum())
                kept_upper += int((lower <= np.partition(upper, kk)[kk]).sum())
                total += len(rows)
            print(f"| {eps0} | {k} | {total / len(q):.0f} | {kept_exact / total:.3f} | {kept_upper / total:.3f} |")
            sys.stdout.flush()


if __name__ == '__main__':
    if sys.argv[1:2] == ['fashion']:
        run(*fashion())
    elif sys.argv[1:2] == ['text'] and len(sys.argv) == 5:
        run(*text(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    else:
        sys.exit(__doc__)
