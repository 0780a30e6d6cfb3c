"""``sample``: PyMC's ``pm.sample``, its gradient evaluations split over the ranks.

``pm.sample`` builds its NUTS sampler's log-density-and-gradient function by calling the
model's ``logp_dlogp_function``; for the call, :func:`sample` gives the model one that
builds :class:`~synkhronos.extensions.pymc.density.SplitDensity` instead, so that the
initialization, the adaptation and the draws are all PyMC's own. The chains run one after
another in rank 0's process (``cores=1``), each evaluation on every rank.
``nuts_sampler="numpyro"`` or ``"blackjax"`` runs that library's NUTS compiled whole on
every rank instead (:mod:`.compiled`), on CPU and GPU ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from synkhronos.extensions.pymc.compiled import (
    SAMPLERS,
    CompiledDensity,
    jax_cpu_device,
    sample_on_ranks,
)
from synkhronos.extensions.pymc.density import SplitDensity, logp_dlogp_function
from synkhronos.extensions.pymc.terms import row_count
from synkhronos.session import launch

logger = logging.getLogger(__name__)

#: The rows below which :func:`sample` runs ``pm.sample`` unsplit, by the ranks (CPU
#: ranks, of backend "cpu" or "jax-cpu", or GPU ranks) and ``nuts_sampler``: the
#: smallest size measured where the split, on 2 ranks of a 2-core machine, sampled
#: faster than the same sampler in one process
#: (``bench/bench_pymc.py --samplers``, docs/pymc.rst). The compiled NUTS (numpyro's)
#: paid at 100,000 rows on CPU ranks and at 1,000,000 on GPU ranks on CPU devices; pymc's
#: and nutpie's were measured on CPU ranks, and GPU ranks take the same. blackjax is
#: always split: PyMC 6.4's own blackjax sampling fails with blackjax 1.7.
MIN_ROWS = {
    "cpu": {"pymc": 100_000, "nutpie": 100_000, "numpyro": 100_000, "blackjax": 0},
    "gpu": {"pymc": 100_000, "nutpie": 100_000, "numpyro": 1_000_000, "blackjax": 0},
}

# Each model's split functions, by what they were built for: a later sampling of the
# model in the same session reuses its function (its ranks' compiled code and the rows in
# shared memory), as PyMC caches its own.
_built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def sample(*args, model: Any = None, min_rows: int | None = None, **kwargs) -> Any:
    """``pm.sample(*args, **kwargs)`` with every evaluation of the model's log-density and
    its gradient by NUTS (and HMC) split by rows over the ranks of the session.

    Call :func:`synkhronos.fork` first. Takes what ``pm.sample`` takes, and returns what
    it returns (``InferenceData``). ``cores`` must be 1 (the default here): the chains
    run in this process, one after another, since every chain's evaluations use all the
    ranks. ``nuts_sampler``, unless given, is "nutpie" (the fastest that calls the split
    function on CPU ranks, measured: ``docs/pymc.rst``), or "pymc" where the model has
    discrete variables, which NUTS alone cannot sample; never chosen by what is
    installed (PyMC's own default is nutpie only where nutpie is installed, and
    unsplit):

    - "pymc": PyMC's NUTS in this process, each evaluation split over the ranks;
    - "nutpie": nutpie's NUTS (Rust) in this process, calling the same split function;
    - "numpyro" or "blackjax", on CPU and GPU ranks: that library's NUTS compiled
      whole into one XLA program per rank (:mod:`.compiled`), its chains in it; the
      draws' posterior attributes ``synk_compile_s`` and ``synk_sampling_s`` say how
      long rank 0 compiled and ran it;
    - any other is refused, saying why.

    Parameters
    ----------
    *args, **kwargs
        What ``pm.sample`` takes.
    model : pymc.Model, optional
        Default: the model of the ``with`` block.
    min_rows : int, optional
        The rows below which the call is ``pm.sample(*args, **kwargs)`` itself, unsplit,
        with the same sampler (a warning, once per model and sampler, says so); default:
        :data:`MIN_ROWS` of the session's ranks and the sampler. ``min_rows=0``
        always splits.

    Raises
    ------
    ValueError
        If ``cores`` is not 1, or ``nuts_sampler`` is none of these.
    ImportError
        If the sampler asked for is not installed.
    synkhronos.extensions.pymc.terms.RowsNotSplittable
        If a term of the rows does not factor over them, naming the term.
    """
    import pymc as pm

    model = pm.modelcontext(model)
    kwargs.setdefault("cores", 1)
    if kwargs["cores"] != 1:
        raise ValueError("synk_pymc.sample runs its chains in rank 0's process: cores=1")
    # Chosen here, never by what is installed: PyMC's default is nutpie where it is.
    sampler = kwargs.setdefault("nuts_sampler", "pymc" if model.discrete_value_vars else "nutpie")
    # "cpu" and "jax-cpu" ranks alike sum by shared memory: CPU ranks' thresholds.
    thresholds = MIN_ROWS["gpu" if launch.current().backend.name == "gpu" else "cpu"]
    if sampler not in thresholds:
        raise ValueError(
            f"synk_pymc.sample splits the NUTS of pymc, nutpie, numpyro and blackjax: "
            f"not nuts_sampler={sampler!r}"
        )
    if _too_few_rows(model, sampler, thresholds[sampler] if min_rows is None else min_rows):
        return pm.sample(*args, model=model, **kwargs)
    if sampler in SAMPLERS:
        return _sample_compiled(model, sampler, *args, **kwargs)
    if sampler == "nutpie":
        return _sample_nutpie(model, *args, **kwargs)

    def split(
        grad_vars=None, tempered: bool = False, initial_point=None, ravel_inputs=None, **kw
    ) -> SplitDensity:
        if tempered or ravel_inputs is False:
            raise ValueError("synk_pymc splits the raveled, untempered log-density only")
        return _split_function(model, grad_vars, initial_point, **kw)

    model.logp_dlogp_function = split  # the model's own, for this call only
    try:
        return pm.sample(*args, model=model, **kwargs)
    finally:
        del model.logp_dlogp_function


def _too_few_rows(model: Any, sampler: str, min_rows: int) -> bool:
    """Whether the model has fewer rows than ``min_rows``; the first time for this model
    and sampler, a warning says so."""
    n_rows = row_count(model)
    if n_rows >= min_rows:
        return False
    told = _built.setdefault(model, {})
    if ("unsplit", sampler) not in told:
        told["unsplit", sampler] = True
        logger.warning(
            "synk_pymc.sample: %d rows, fewer than min_rows=%d for nuts_sampler=%r, below "
            "which the split sampled slower than one process: sampling unsplit, as "
            "pm.sample does (min_rows=0 splits)",
            n_rows,
            min_rows,
            sampler,
        )
    return True


def _split_function(model: Any, grad_vars=None, initial_point=None, **kw) -> SplitDensity:
    """The model's split function for these variables, built once per session."""
    names = None if grad_vars is None else tuple(str(v) for v in grad_vars)
    # A variable or potential added to the model since makes another function.
    terms = (*model.basic_RVs, *model.potentials, *model.value_vars)
    key = (terms, names, repr(sorted(kw.items())))
    built = _built.setdefault(model, {})
    split_fn = built.get(key)
    if split_fn is None or split_fn.session is not launch.current():
        split_fn = logp_dlogp_function(model, grad_vars, initial_point=initial_point, **kw)
        built[key] = split_fn
    if initial_point is not None:
        split_fn.set_extra_values(initial_point)
    return split_fn


def _sample_nutpie(model: Any, *args, **kwargs) -> Any:
    """``pm.sample`` with ``nuts_sampler="nutpie"``: nutpie's NUTS (Rust) calling the split
    function. nutpie's model of the PyMC model is made in JAX mode, whose log-density is a
    Python function, and that function is replaced by the split one (its draws' expansion
    stays nutpie's). Its raveled point is the free variables' values in the model's order,
    as the split function's."""
    import pymc as pm

    try:
        import nutpie
    except ImportError as missing:
        raise ImportError(
            "nuts_sampler='nutpie' (synk_pymc.sample's default) needs nutpie: "
            "pip install 'synkhronos[pymc]', or pass nuts_sampler='pymc'"
        ) from missing
    if model.discrete_value_vars:
        raise ValueError("nutpie samples continuous variables only")
    split_fn = _split_function(model)
    own = nutpie.compile_pymc_model

    def compile_split(of: Any, **compile_kwargs) -> Any:
        compile_kwargs.update(backend="jax", gradient_backend="pytensor")
        compiled = own(of, **compile_kwargs)
        return dataclasses.replace(
            compiled, _make_logp_func=lambda: functools.partial(_logp, split_fn)
        )

    nutpie.compile_pymc_model = compile_split
    try:
        return pm.sample(*args, model=model, **kwargs)
    finally:
        nutpie.compile_pymc_model = own


def _logp(split_fn: SplitDensity, x: np.ndarray, **_shared) -> tuple[float, np.ndarray]:
    """nutpie's log-density callback (its data containers, ``_shared``, the split function
    reads from the model itself)."""
    logp, grad = split_fn(x)
    return float(logp), np.ascontiguousarray(grad, dtype="float64")


@contextlib.contextmanager
def _xla_flags_kept() -> Iterator[None]:
    """``XLA_FLAGS`` as the session set them (rank 0's cores) after the block."""
    saved = os.environ.get("XLA_FLAGS")
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved


def _sample_compiled(model: Any, sampler: str, *args, **kwargs) -> Any:
    """``pm.sample`` with ``nuts_sampler`` numpyro or blackjax, its sampling run by every
    rank (:func:`.compiled.sample_on_ranks`)."""
    import pymc as pm

    with _xla_flags_kept():  # its import forces 100 host devices into them
        import pymc.sampling.jax as pymc_jax

    key = ("compiled", *model.basic_RVs, *model.potentials, *model.value_vars)
    built = _built.setdefault(model, {})
    session = launch.current()
    density = built.get(key)
    if density is None or density.session is not session:
        density = built[key] = CompiledDensity(model)
    if session.backend.name != "gpu":  # before PyMC starts JAX here: one device
        jax_cpu_device()
    name = f"_sample_{sampler}_nuts"
    own = getattr(pymc_jax, name)
    setattr(pymc_jax, name, functools.partial(sample_on_ranks, density, sampler))
    try:
        idata = pm.sample(*args, model=model, **kwargs)
    finally:
        setattr(pymc_jax, name, own)
    idata["posterior"].attrs["synk_compile_s"], idata["posterior"].attrs["synk_sampling_s"] = (
        density.times
    )
    return idata


__all__ = ["MIN_ROWS", "sample"]
