"""PyMC models sampled on N ranks: the log-density and its gradient split by rows.

``from synkhronos.extensions import pymc as synk_pymc``; after :func:`synkhronos.fork`,
inside a ``pm.Model``, ``synk_pymc.sample(...)`` is ``pm.sample(...)`` with every
evaluation of the log-density and its gradient split over the ranks by the rows of the
observed data; :func:`logp_dlogp_function` is that split function itself, for other
samplers and optimizers. ``sample(nuts_sampler="numpyro")`` (or "blackjax") compiles
the whole NUTS into one program per rank, on CPU and GPU ranks (:class:`CompiledDensity`,
:mod:`.compiled`). Needs PyMC 6 (Python 3.12; ``pip install synkhronos[pymc]``),
imported when a function is called. See ``docs/pymc.rst``.
"""

from synkhronos.extensions.pymc.compiled import CompiledDensity
from synkhronos.extensions.pymc.density import SplitDensity, logp_dlogp_function
from synkhronos.extensions.pymc.sampling import MIN_ROWS, sample
from synkhronos.extensions.pymc.terms import RowsNotSplittable

__all__ = [
    "MIN_ROWS",
    "CompiledDensity",
    "RowsNotSplittable",
    "SplitDensity",
    "logp_dlogp_function",
    "sample",
]
