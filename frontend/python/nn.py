"""`gir.nn`: jax.nn's functions that gir has: softmax, log_softmax, one_hot, logsumexp, and the
activations (relu, sigmoid, gelu, silu/swish, softplus, log_sigmoid, relu6, leaky_relu, elu,
celu, selu, soft_sign, hard_tanh, hard_sigmoid, hard_silu/hard_swish, mish, glu)."""

from .activations import (  # noqa: F401 - re-exported
    celu,
    elu,
    gelu,
    glu,
    hard_sigmoid,
    hard_silu,
    hard_swish,
    hard_tanh,
    leaky_relu,
    log_sigmoid,
    mish,
    relu6,
    selu,
    silu,
    soft_sign,
    softplus,
    swish,
)
from .numpy_api import logsumexp, relu, sigmoid  # noqa: F401 - re-exported
from .numpy_extra import log_softmax, one_hot, softmax  # noqa: F401 - re-exported

__all__ = ["celu", "elu", "gelu", "glu", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh", "leaky_relu",
           "log_sigmoid", "log_softmax", "logsumexp", "mish", "one_hot", "relu", "relu6", "selu", "sigmoid", "silu",
           "soft_sign", "softmax", "softplus", "swish"]
