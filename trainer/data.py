"""Datasets and the distributed sampler.

Datasets (features as float32, pixels scaled to [0, 1]; labels as int64):

- `digits`: the 8x8 handwritten digits shipped inside scikit-learn (1797 images, 64
  features, 10 classes). No download. A fixed 20% is held out as the test set.
- `mnist`: MNIST from the IDX files in a directory (train-images-idx3-ubyte,
  train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each possibly
  gzipped), as distributed by its authors.
- `synthetic`: generated, MNIST-shaped by default (784 features, 10 classes): each class is
  a random prototype image plus noise, so a model can learn it. For benchmarks and tests.

The sampler deals each global batch out to the ranks (see `DistributedSampler`).
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path

import numpy

from collectives import chunk_bounds

DATASETS = ("digits", "mnist", "synthetic")

# IDX type codes (the third byte of the magic number) and the big-endian dtypes they name.
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass
class Dataset:
    name: str
    x_train: numpy.ndarray  # (n, features) float32
    y_train: numpy.ndarray  # (n,) int64
    x_test: numpy.ndarray
    y_test: numpy.ndarray
    classes: int

    @property
    def features(self) -> int:
        return self.x_train.shape[1]


def load(name: str, data_dir: str | Path | None = None) -> Dataset:
    """Load a dataset by name; `data_dir` is needed by (and only by) `mnist`."""
    if name == "digits":
        return digits()
    if name == "mnist":
        if data_dir is None:
            raise ValueError("the mnist dataset needs --data-dir, the directory of its IDX files")
        return mnist(data_dir)
    if name == "synthetic":
        return synthetic()
    raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")


def digits(test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's digits, pixels scaled from 0..16 to [0, 1]; a fixed shuffle splits it."""
    from sklearn.datasets import load_digits  # imported here: scikit-learn is slow to import

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(numpy.float32)
    y = bunch.target.astype(numpy.int64)
    order = numpy.random.default_rng(0).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset("digits", x[train], y[train], x[test], y[test], 10)


def read_idx(path: str | Path) -> numpy.ndarray:
    """Read one IDX file (optionally gzipped): magic 0 0 <type> <ndim>, big-endian uint32
    sizes, then the data, big-endian, row-major."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    shape = tuple(int(n) for n in numpy.frombuffer(raw, ">u4", ndim, offset=4))
    dtype = numpy.dtype(IDX_TYPES[raw[2]])
    body = 4 + 4 * ndim
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) - body != expected:
        raise ValueError(f"{path}: header says {shape} of {dtype} ({expected} bytes), "
                         f"but {len(raw) - body} bytes follow")
    return numpy.frombuffer(raw, dtype, offset=body).reshape(shape).astype(dtype.newbyteorder("="))


def _find_idx(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (directory / name).exists():
            return directory / name
    raise FileNotFoundError(f"{directory} has no {stem} (or {stem}.gz)")


def mnist(data_dir: str | Path) -> Dataset:
    """MNIST (or any set in its IDX layout) from `data_dir`; pixels 0..255 scaled to [0, 1]."""
    directory = Path(data_dir)
    arrays = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(_find_idx(directory, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find_idx(directory, f"{prefix}-labels-idx1-ubyte"))
        if len(images) != len(labels):
            raise ValueError(f"{directory}: {len(images)} {split} images but {len(labels)} labels")
        arrays[split] = ((images.reshape(len(images), -1) / 255.0).astype(numpy.float32),
                         labels.astype(numpy.int64))
    classes = int(max(arrays["train"][1].max(initial=0), arrays["test"][1].max(initial=0))) + 1
    return Dataset("mnist", *arrays["train"], *arrays["test"], classes)


def synthetic(train: int = 8192, test: int = 2048, features: int = 784, classes: int = 10,
              seed: int = 0) -> Dataset:
    """Random class prototypes in [0, 1] plus Gaussian noise of standard deviation 3:
    learnable, not trivially."""
    rng = numpy.random.default_rng(seed)
    prototypes = rng.random((classes, features), dtype=numpy.float32)

    def draw(n: int) -> tuple[numpy.ndarray, numpy.ndarray]:
        y = rng.integers(0, classes, n)
        x = prototypes[y] + 3 * rng.standard_normal((n, features), dtype=numpy.float32)
        return x, y.astype(numpy.int64)

    return Dataset("synthetic", *draw(train), *draw(test), classes)


class DistributedSampler:
    """Which samples each rank trains on, step by step, in one epoch.

    An epoch shuffles all `n` sample indices (from `seed` and the epoch number, so every rank
    draws the same permutation and each epoch differs), pads the order by repeating it from
    the start up to whole global batches, and cuts it into `steps` global batches. Rank r
    takes slice r of each (`chunk_bounds`), so the shards are disjoint and every rank runs
    the same number of steps. The global batches do not depend on the number of ranks: one
    process and N ranks see the same batches, which is what makes their training agree.
    """

    def __init__(self, n: int, global_batch: int, rank: int, size: int, seed: int = 0,
                 shuffle: bool = True) -> None:
        if n < 1:
            raise ValueError("the dataset is empty")
        if global_batch < size:
            raise ValueError(f"the global batch ({global_batch}) must give every one of the "
                             f"{size} ranks at least one sample")
        self.n, self.global_batch, self.seed, self.shuffle = n, global_batch, seed, shuffle
        self.lo, self.hi = chunk_bounds(global_batch, size)[rank]
        self.steps = math.ceil(n / global_batch)

    def __len__(self) -> int:
        return self.steps

    def batches(self, epoch: int) -> numpy.ndarray:
        """This rank's sample indices for each step of `epoch`: shape (steps, local batch)."""
        order = numpy.random.default_rng([self.seed, epoch]).permutation(self.n) \
            if self.shuffle else numpy.arange(self.n)
        order = numpy.resize(order, self.steps * self.global_batch)
        return order.reshape(self.steps, self.global_batch)[:, self.lo: self.hi]
