"""Arrays drawn from ``numpy.random.RandomState(seed)``, in the order the contract fixes."""

import numpy as np

from service.core.types import Array, Init


def draw(seed: int, init: Init, shapes: list[tuple[str, tuple[int, ...]]]) -> dict[str, Array]:
    """Draw each named array in the order given, from one RandomState(seed).

    ``uniform`` uses ``rand`` (U[0, 1)), ``normal`` uses ``randn`` (N(0, 1)), so
    ``draw(0, "uniform", [("w_q", (4, 4))])["w_q"]`` equals a notebook's
    ``np.random.seed(0); np.random.rand(4, 4)``.
    """
    rng = np.random.RandomState(seed)
    sample = rng.rand if init == "uniform" else rng.randn
    return {name: np.asarray(sample(*shape), dtype=np.float64) for name, shape in shapes}
