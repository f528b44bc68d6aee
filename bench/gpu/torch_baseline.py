"""Baselines on the same GPU with PyTorch: tiled GEMM + torch.topk exact search
over gpu_bench's data (tools/gen_synthetic's .fvecs files), and torch.topk on
a 10000 x 128000 uniform matrix (the k-selection benchmark's shape).

usage: torch_baseline.py BASE.fvecs QUERIES.fvecs"""
import sys

import torch

from fvecs import read_fvecs


def median_ms(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def exact(q, x, xn, k, tq=2048, tn=131072):
    """Same tiling as exact_knn: fp32 GEMM tile, norms, topk, running merge."""
    out_d, out_i = [], []
    for q0 in range(0, q.shape[0], tq):
        qt = q[q0:q0 + tq]
        qn = (qt * qt).sum(1, keepdim=True)
        bd = bi = None
        for n0 in range(0, x.shape[0], tn):
            xt = x[n0:n0 + tn]
            dist = torch.addmm(qn + xn[None, n0:n0 + tn], qt, xt.t(), alpha=-2.0)
            td, ti = torch.topk(dist, k, dim=1, largest=False)
            ti += n0
            if bd is not None:
                td, sel = torch.topk(torch.cat([bd, td], 1), k, dim=1, largest=False)
                ti = torch.gather(torch.cat([bi, ti], 1), 1, sel)
            bd, bi = td, ti
        out_d.append(bd)
        out_i.append(bi)
    return torch.cat(out_d), torch.cat(out_i)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    m = torch.rand(10000, 128000, device=dev)
    print("\n## torch.topk on 10000 x 128000 float32\n\n| k | ms |\n|---|---|")
    for k in (10, 100, 1000, 2048):
        print(f"| {k} | {median_ms(lambda: torch.topk(m, k, dim=1, largest=False), 5):.3f} |", flush=True)
    del m
    x = torch.from_numpy(read_fvecs(sys.argv[1])).to(dev)
    q = torch.from_numpy(read_fvecs(sys.argv[2])).to(dev)
    xn = (x * x).sum(1)
    print(f"\n## torch exact search {q.shape[0]} x {x.shape[0]} (fp32 GEMM + topk, same tiles)\n")
    print("| k | GEMM + topk ms | GEMM alone ms |\n|---|---|---|")
    def gemm_only():
        for q0 in range(0, q.shape[0], 2048):
            for n0 in range(0, x.shape[0], 131072):
                torch.mm(q[q0:q0 + 2048], x[n0:n0 + 131072].t())
    g = median_ms(gemm_only)
    for k in (10, 100):
        print(f"| {k} | {median_ms(lambda: exact(q, x, xn, k)):.2f} | {g:.2f} |", flush=True)


if __name__ == "__main__":
    main()
