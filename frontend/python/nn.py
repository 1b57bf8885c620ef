"""`gir.nn`: jax.nn's functions that gir has (softmax, log_softmax, one_hot, relu, sigmoid,
logsumexp)."""

from .numpy_api import logsumexp, relu, sigmoid  # noqa: F401 - re-exported
from .numpy_extra import log_softmax, one_hot, softmax  # noqa: F401 - re-exported

__all__ = ["log_softmax", "logsumexp", "one_hot", "relu", "sigmoid", "softmax"]
