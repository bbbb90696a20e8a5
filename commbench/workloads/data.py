"""A real labelled data set that ships inside a package: scikit-learn's digits.

1,797 handwritten digits (8x8 grey, 10 classes) from ``sklearn.datasets``,
read from the installed package (no download at run time), scaled to
[0, 1], resized to the model's input with bilinear interpolation and
repeated over 3 channels. A fixed, seeded 80/20 split gives the held-out set.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DATASETS = ("synthetic", "digits")
NUM_CLASSES = {"digits": 10}


def digits(image_size: int, seed: int = 0, test_fraction: float = 0.2):
    """Return (train_x, train_y, test_x, test_y) as tensors of shape N x 3 x S x S."""
    from sklearn.datasets import load_digits  # ~1.8 s to import: only --dataset digits pays

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    x = ((x - 0.5) / 0.5).repeat(1, 3, 1, 1)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]
