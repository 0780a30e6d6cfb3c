"""``sample``: PyMC's ``pm.sample``, its gradient evaluations split over the ranks.

``pm.sample`` builds its NUTS sampler's log-density-and-gradient function by calling the
model's ``logp_dlogp_function``; for the call, :func:`sample` gives the model one that
builds :class:`~synkhronos.extensions.pymc.density.SplitDensity` instead, so that the
initialization, the adaptation and the draws are all PyMC's own. The chains run one after
another in rank 0's process (``cores=1``), each evaluation on every rank.
"""

from __future__ import annotations

from typing import Any

from synkhronos.extensions.pymc.density import SplitDensity, logp_dlogp_function


def sample(*args, model: Any = None, **kwargs) -> Any:
    """``pm.sample(*args, **kwargs)`` with every evaluation of the model's log-density and
    its gradient by NUTS (and HMC) split by rows over the ranks of the session.

    Call :func:`synkhronos.fork` first. Takes what ``pm.sample`` takes, and returns what
    it returns (``InferenceData``). ``cores`` must be 1 (the default here): the chains
    run in this process, one after another, since every chain's evaluations use all the
    ranks; ``nuts_sampler`` must be "pymc".

    Raises
    ------
    ValueError
        If ``cores`` is not 1 or ``nuts_sampler`` is not "pymc".
    synkhronos.extensions.pymc.terms.RowsNotSplittable
        If a term of the rows does not factor over them, naming the term.
    """
    import pymc as pm

    model = pm.modelcontext(model)
    kwargs.setdefault("cores", 1)
    if kwargs["cores"] != 1:
        raise ValueError("synk_pymc.sample runs its chains in rank 0's process: cores=1")
    if kwargs.get("nuts_sampler", "pymc") != "pymc":
        raise ValueError("synk_pymc.sample splits PyMC's own NUTS: nuts_sampler='pymc'")

    def split(
        grad_vars=None, tempered: bool = False, initial_point=None, ravel_inputs=None, **kw
    ) -> SplitDensity:
        if tempered or ravel_inputs is False:
            raise ValueError("synk_pymc splits the raveled, untempered log-density only")
        return logp_dlogp_function(model, grad_vars, initial_point=initial_point, **kw)

    model.logp_dlogp_function = split  # the model's own, for this call only
    try:
        return pm.sample(*args, model=model, **kwargs)
    finally:
        del model.logp_dlogp_function


__all__ = ["sample"]
