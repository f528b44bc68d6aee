"""Reads .fvecs files (tools/gen_synthetic --format fvecs) into NumPy arrays."""
import numpy as np


def read_fvecs(path):
    """n x d float32 array: each vector is an int32 d then d float32, little endian."""
    raw = np.fromfile(path, dtype='<i4')
    if raw.size == 0:
        raise ValueError(f'{path}: empty')
    d = int(raw[0])
    if raw.size % (d + 1) or not (raw.reshape(-1, d + 1)[:, 0] == d).all():
        raise ValueError(f'{path}: not an .fvecs file of dimension {d}')
    return raw.reshape(-1, d + 1)[:, 1:].copy().view('<f4')
