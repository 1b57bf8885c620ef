"""`gir.lax`: jax.lax's control flow, stop_gradient and erf."""

from .activations import erf  # noqa: F401 - re-exported
from .control import cond, fori_loop, while_loop  # noqa: F401 - re-exported
from .numpy_extra import stop_gradient  # noqa: F401 - re-exported
from .transforms import scan  # noqa: F401 - re-exported

__all__ = ["cond", "erf", "fori_loop", "scan", "stop_gradient", "while_loop"]
