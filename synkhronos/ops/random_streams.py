"""Random draws that every call of a compiled function draws anew: Theano's
``RandomStreams``, and the default updates that advance their generators.

Each draw has its own shared generator (a NumPy ``Generator`` driven by PyTensor's random
variables), seeded from the stream's seed, whose default update
(:func:`add_default_update`) advances it, as Theano's streams did. Lasagne's noise layers
draw from such streams (:mod:`synkhronos.extensions.lasagne.layers.noise`, each layer
seeded from ``lasagne.random.get_rng()``), and :mod:`synkhronos.theano` publishes them at
Theano's paths (``theano.tensor.shared_randomstreams``, ``theano.sandbox.rng_mrg``). In a
:func:`synkhronos.function` each worker's copy of a generator is reseeded from its rank
(:mod:`synkhronos.rank.graphs`), so the ranks draw different numbers (dropout masks, say);
rank 0 draws what one process would.

>>> import pytensor
>>> srng = RandomStreams(seed=1)
>>> f = pytensor.function([], srng.uniform((3,)))
>>> first, second = f(), f()
>>> bool((first != second).all() and (first < 1).all())
True
"""

import math
import warnings

import numpy as np
import pytensor.tensor as pt
from pytensor import config
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.scalar import upcast
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

__all__ = ["RandomStreams", "add_default_update"]


def add_default_update(variable: SharedVariable, update: Variable) -> None:
    """Make every compiled function whose graph contains ``variable`` apply ``update``.

    This is how random streams advance their generators, and how Lasagne's batch
    normalization updates its averages from an output expression.  PyTensor 3 deprecates
    setting ``default_update`` (its own ``RandomStream`` still does it), so the warning is
    silenced here, in one place.

    Parameters
    ----------
    variable
        Shared variable to update, typically a clone sharing another's storage.
    update
        New value of ``variable`` after each call.
    """
    if isinstance(variable.type, TensorType) and update.type != variable.type:
        # PyTensor wants the two types equal: slicing to the variable's symbolic sizes
        # drops static sizes that the update knows and the variable's type leaves open.
        sizes = (variable.shape[axis] for axis in range(variable.ndim))
        update = pt.cast(update, variable.dtype)[tuple(slice(0, n) for n in sizes)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        variable.default_update = update


_EDGE = 2.0  # truncated normals keep draws within this many standard deviations


class RandomStreams:
    """A source of random draws with Theano's methods and defaults.

    Parameters
    ----------
    seed : int, optional
        Seeds every generator this stream creates (None: fresh entropy).
    """

    def __init__(self, seed: int | None = None):
        self.default_instance_seed = seed
        self.state_updates: list[tuple] = []  # (shared generator, its next state)
        self.seed(seed)

    def seed(self, seed: int | None = None) -> None:
        """Reseed every generator made so far, and those to come, from ``seed`` (None:
        the seed given at construction); draws then repeat what a new stream made with
        ``seed`` would draw."""
        if seed is None:
            seed = self.default_instance_seed
        self._entropy = np.random.SeedSequence(seed).entropy
        for k, (generator, _) in enumerate(self.state_updates):
            generator.set_value(self._generator(k), borrow=True)

    def updates(self) -> list[tuple]:
        """The ``(generator, next state)`` pairs, which compiled functions apply by
        default."""
        return list(self.state_updates)

    def _generator(self, k: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence(self._entropy, spawn_key=(k,)))

    def _draw(self, distribution: str, *params, size) -> TensorVariable:
        generator = pt.random.shared_rng(self._generator(len(self.state_updates)))
        next_state, sample = getattr(generator, distribution)(*params, size=size)
        add_default_update(generator, next_state)
        self.state_updates.append((generator, next_state))
        return sample

    @staticmethod
    def _float_params(dtype, *params) -> tuple[str, list]:
        params = [pt.as_tensor_variable(p) for p in params]
        if dtype is None:  # at least as precise as floatX
            dtype = upcast(config.floatX, *[p.dtype for p in params])
        return dtype, [pt.cast(p, dtype) for p in params]

    def uniform(
        self, size=(), low=0.0, high=1.0, ndim=None, dtype=None, nstreams=None
    ) -> TensorVariable:
        """Draws from the uniform distribution on [low, high).

        Parameters
        ----------
        size : tuple or TensorVariable
            The draw's shape (ints or symbolic sizes, or a shape vector).
        low, high : tensor_like
        ndim, nstreams
            Theano's hints (the number of axes, MRG's parallel streams); unused.
        dtype : str, optional
            Default: the upcast of floatX and the bounds' dtypes.
        """
        dtype, (low, high) = self._float_params(dtype, low, high)
        return pt.cast(self._draw("uniform", low, high, size=size), dtype)

    def normal(
        self,
        size=(),
        avg=0.0,
        std=1.0,
        ndim=None,
        dtype=None,
        nstreams=None,
        truncate: bool = False,
    ) -> TensorVariable:
        """Draws from the normal distribution of mean ``avg`` and deviation ``std``; with
        ``truncate``, from that distribution cut at two deviations from the mean.

        Parameters are :meth:`uniform`'s; ``dtype`` defaults to the upcast of floatX and
        ``avg``'s and ``std``'s dtypes.
        """
        dtype, (avg, std) = self._float_params(dtype, avg, std)
        if not truncate:
            return pt.cast(self._draw("normal", avg, std, size=size), dtype)
        # The inverse of the normal CDF maps uniform draws on [CDF(-2), CDF(2)) onto the
        # truncated distribution.
        edge = math.erf(_EDGE / math.sqrt(2))
        u = self._draw("uniform", -edge, edge, size=size)
        return pt.cast(avg + std * math.sqrt(2) * pt.erfinv(u), dtype)

    def binomial(
        self, size=(), n=1, p=0.5, ndim=None, dtype="int64", nstreams=None
    ) -> TensorVariable:
        """Draws of the number of successes in ``n`` trials of probability ``p``
        (``n=1``: a 0/1 mask). Parameters are :meth:`uniform`'s."""
        if isinstance(n, int) and n == 1:
            # A Bernoulli draw: PyTensor's JAX backend samples it, not the binomial.
            return pt.cast(self._draw("bernoulli", p, size=size), dtype)
        return pt.cast(self._draw("binomial", n, p, size=size), dtype)
