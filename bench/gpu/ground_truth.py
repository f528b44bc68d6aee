#!/usr/bin/env python3
"""Exact ground truth for the SQL benchmarks on the GPU machine.

Reads DIR/base.fvecs and the first NQ vectors of DIR/queries.fvecs (written
by tools/gen_synthetic, see data.sh) and writes DIR/queries.txt, COPY text
rows (qid, v real[], gt int[]): each query with the ids of its 100 nearest
base rows by L2, nearest first. Ids are 1-based in file order, as
gen_synthetic numbers its rows. Distances are computed in float64 (torch on
the GPU when there is one; NumPy otherwise), never TF32, which misorders
close neighbours.

usage: ground_truth.py DIR [NQ]
"""
import os
import sys

import numpy as np

from fvecs import read_fvecs

out = sys.argv[1]
nq = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
base = read_fvecs(os.path.join(out, 'base.fvecs'))
queries = read_fvecs(os.path.join(out, 'queries.fvecs'))[:nq]

try:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    b = torch.from_numpy(base).to(dev, torch.float64)
    bn = (b * b).sum(1)
    gt = []
    for i in range(0, len(queries), 100):
        q = torch.from_numpy(queries[i:i + 100]).to(dev, torch.float64)
        dist = (q * q).sum(1, keepdim=True) - 2 * q @ b.T + bn[None, :]
        gt.append(torch.topk(dist, 100, largest=False).indices.cpu().numpy() + 1)
    gt = np.concatenate(gt)
except ImportError:
    b = base.astype(np.float64)
    gt = np.stack([np.argsort(((b - q) ** 2).sum(1))[:100] + 1 for q in queries.astype(np.float64)])

# %.9g reads back as the same float32, so the table holds the exact query.
with open(os.path.join(out, 'queries.txt'), 'w') as f:
    for i in range(len(queries)):
        f.write('%d\t{%s}\t{%s}\n' % (i + 1, ','.join('%.9g' % x for x in queries[i]),
                                      ','.join(str(int(x)) for x in gt[i])))
print('ground truth of %d queries over %d base vectors (d=%d) in %s' % (len(queries), len(base),
                                                                       base.shape[1], out))
