"""Data-parallel training on top of the collectives: a NumPy/CuPy autograd, modules, SGD,
Adam and LAMB, DistributedDataParallel and ZeRO. `python -m trainer` trains an MLP classifier
with them.

    from trainer import MLP, Adam, DistributedDataParallel, Tensor, cross_entropy
"""

from .ddp import DistributedDataParallel
from .nn import MLP, Linear, Module, ReLU, Sequential, Tanh
from .optim import LAMB, SGD, Adam
from .tensor import Tensor, cross_entropy
from .zero import ShardedOptimizer, ZeroDataParallel

__all__ = ["Tensor", "cross_entropy", "Module", "Linear", "ReLU", "Tanh", "Sequential", "MLP",
           "SGD", "Adam", "LAMB", "DistributedDataParallel", "ZeroDataParallel",
           "ShardedOptimizer"]
