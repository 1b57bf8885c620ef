"""The in-memory IR: types, nodes, the op registry, printer, verifier and interpreter."""

from .core import Block, BlockArgument, Function, Module, Operation, OpResult, Region, Value
from .ops import REGISTRY, OpSpec, make_op
from .types import TensorType, VarType

__all__ = ["Block", "BlockArgument", "Function", "Module", "OpResult", "OpSpec", "Operation", "REGISTRY",
           "Region", "TensorType", "Value", "VarType", "make_op"]
