#!/usr/bin/env python3
"""Deterministic SIFT-like data for the SQL benchmark on the GPU machine.

Writes base vectors (PostgreSQL binary COPY: id int4, v real[]) and queries
with their exact top-100 neighbours (L2, computed with torch on the GPU when
there is one) as text COPY files.

usage: make_sift_like.py OUTDIR [N] [NQ] [D]
"""
import os
import struct
import sys

import numpy as np

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
nq = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
d = int(sys.argv[4]) if len(sys.argv) > 4 else 128
os.makedirs(out, exist_ok=True)

# A mixture of 1000 Gaussian clusters with uneven spread, like local image
# descriptors: the clusters overlap (centres about as far apart as their
# radii), so there is no exact structure for IVF to exploit.
rng = np.random.default_rng(42)
centers = rng.normal(0.0, 1.0, size=(1000, d)).astype(np.float32)
spread = rng.uniform(0.7, 1.3, size=1000).astype(np.float32)


def sample(count, rng):
    c = rng.integers(0, 1000, size=count)
    return centers[c] + rng.normal(size=(count, d)).astype(np.float32) * spread[c, None]


base = sample(n, rng)
queries = sample(nq, np.random.default_rng(7))

# Binary COPY: header, then per row (2 fields): id int4, float4[] (ndim 1).
rec = np.dtype([('nf', '>i2'), ('l1', '>i4'), ('id', '>i4'), ('l2', '>i4'), ('ndim', '>i4'),
                ('hasnull', '>i4'), ('oid', '>i4'), ('dim', '>i4'), ('lb', '>i4'),
                ('v', [('len', '>i4'), ('x', '>f4')], (d,))])
rows = np.zeros(n, dtype=rec)
rows['nf'] = 2
rows['l1'] = 4
rows['id'] = np.arange(1, n + 1)
rows['l2'] = 20 + 8 * d
rows['ndim'] = 1
rows['oid'] = 700
rows['dim'] = d
rows['lb'] = 1
rows['v']['len'] = 4
rows['v']['x'] = base
with open(os.path.join(out, 'base.copy'), 'wb') as f:
    f.write(b'PGCOPY\n\xff\r\n\0' + struct.pack('>ii', 0, 0))
    f.write(rows.tobytes())
    f.write(struct.pack('>h', -1))

try:
    import torch
    # Exact ground truth: float64, no TF32 (which some PyTorch builds enable
    # by default and which misorders close neighbours).
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    b = torch.from_numpy(base).to(dev, torch.float64)
    gt = []
    for i in range(0, nq, 100):
        q = torch.from_numpy(queries[i:i + 100]).to(dev, torch.float64)
        dist = (q * q).sum(1, keepdim=True) - 2 * q @ b.T + (b * b).sum(1)[None, :]
        gt.append(torch.topk(dist, 100, largest=False).indices.cpu().numpy() + 1)
    gt = np.concatenate(gt)
except ImportError:
    gt = np.stack([np.argsort(((base - q) ** 2).sum(1))[:100] + 1 for q in queries])

with open(os.path.join(out, 'queries.txt'), 'w') as f:
    for i in range(nq):
        f.write('%d\t{%s}\t{%s}\n' % (i + 1, ','.join('%.6g' % x for x in queries[i]),
                                      ','.join(str(int(x)) for x in gt[i])))
print('wrote %d base vectors, %d queries (d=%d) to %s' % (n, nq, d, out))
