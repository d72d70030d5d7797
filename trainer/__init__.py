"""Data-parallel training on top of the collectives: a NumPy/CuPy autograd, modules, SGD,
and DistributedDataParallel. `python -m trainer` trains an MLP classifier with them.

    from trainer import MLP, SGD, DistributedDataParallel, Tensor, cross_entropy
"""

from .ddp import DistributedDataParallel
from .nn import MLP, Linear, Module, ReLU, Sequential, Tanh
from .optim import SGD
from .tensor import Tensor, cross_entropy

__all__ = ["Tensor", "cross_entropy", "Module", "Linear", "ReLU", "Tanh", "Sequential", "MLP",
           "SGD", "DistributedDataParallel"]
