"""`gir.device_put` and `gir.device_get`: pytrees of arrays moved to the GPU once and back, as
`jax.device_put` / `jax.device_get` do, so that a training loop keeps its parameters and
optimizer state on the device between calls of a `device="gpu"` function (docs/gpu.md
*Training on the device*).

    params, state = gir.device_put((params, opt.init(params)), "gpu")   # uploaded once
    loss, params, state = step(params, state, xs, ys)                   # device arrays in and out
    print(float(gir.device_get(loss)))                                   # read back when printed

The device arrays are the GPU backend's array module's (`cupy.ndarray` on a GPU, simcupy's in
the CUDA simulator), the arrays a `device="gpu"` function hands back when any argument is a
device array. Python numbers stay Python numbers (gir.jit traces them weakly typed); anything
else must be an array.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend.gpu.device import get_device, is_device_array
from ..errors import GirArgumentError
from ..frontend.python.tree_util import tree_leaves, tree_map

DEVICES = ("cpu", "gpu", "interp", "auto")


def device_put(tree: Any, device: str = "gpu") -> Any:
    """tree with every array leaf on `device`: for "gpu", NumPy arrays uploaded (one copy each)
    and device arrays kept as they are (no copy); for "cpu" and "interp", NumPy arrays (device
    arrays downloaded), so that one line serves a loop written for either device."""
    if device not in DEVICES:
        raise GirArgumentError(f"device_put: device {device!r} is not one of {', '.join(DEVICES)}")
    if device != "gpu":
        return device_get(tree)
    dev = get_device()

    def put(leaf: Any) -> Any:
        if is_device_array(leaf):
            return dev.as_device(leaf)
        if isinstance(leaf, (bool, int, float)):
            return leaf
        if not isinstance(leaf, (np.ndarray, np.generic)):
            raise GirArgumentError(f"device_put: a leaf is a {type(leaf).__name__}, not an array or a number")
        return dev.to_device(np.asarray(leaf))

    return tree_map(put, tree)


def device_get(tree: Any) -> Any:
    """tree with every device-array leaf copied to a NumPy array (one download each: each waits
    for the device's work on it); other leaves as they are."""
    if not any(is_device_array(leaf) for leaf in tree_leaves(tree)):
        return tree
    dev = get_device()
    return tree_map(lambda leaf: dev.download(dev.as_device(leaf)) if is_device_array(leaf) else leaf, tree)


__all__ = ["device_get", "device_put"]
