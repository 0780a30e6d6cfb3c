"""NUTS compiled whole into one XLA program per rank, the rows' log-density summed inside.

``synk_pymc.sample(nuts_sampler="numpyro")`` (or ``"blackjax"``) runs PyMC's own
``pm.sample`` for that sampler on rank 0, which picks the initial points and turns the
draws into ``InferenceData``, with its sampling step replaced by a routine
(:func:`synkhronos.api.routines.run`) that every rank runs: each rank makes JAX functions
of the model's terms (PyTensor's JAX backend, as PyMC does) and compiles the whole of NUTS,
warm-up and draws, into one XLA program. In it the log-density is the rank's own rows'
terms, their value and gradient summed over the ranks inside it, plus the terms computed
once (the priors, the Jacobians), which every rank computes alike. The program and the
chains are the same on both backends; only the sum differs, chosen by the communicator:

- GPU ranks (JAX mode): the program runs over the ranks' mesh
  (:meth:`~synkhronos.transport.comm.xla.XlaCommunicator.program`), summing by collective
  permutes in rank order (:func:`~synkhronos.transport.comm.traced.sum_in_order_traced`);
- CPU ranks: the program runs on the rank's own JAX CPU device, JAX started on the rank's
  cores (JAX is imported on a CPU rank only here), summing by the rank's communicator
  (over MPI nodes, its all-reduce spans the nodes) called back from the program
  (:func:`~synkhronos.transport.comm.traced.sum_by_host_traced`).

Every rank starts from the same point with the same key and receives the same sums, so
every rank takes the same trajectory; rank 0 checks that every rank's draws are its own,
bit for bit, and returns them. The chains of one call run in the program as PyMC's
``chain_method`` says: "vectorized" together (``jax.vmap``; on CPU ranks one all-reduce
an evaluation for all of them), "parallel" (its default) one after another, as numpyro
runs parallel chains on one device (each rank has one).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import pickle
import time
from typing import Any

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.extensions.pymc.density import with_checks_rewritten
from synkhronos.extensions.pymc.terms import ModelTerms, split_terms
from synkhronos.rank.routine_part import from_text, text
from synkhronos.session import launch

logger = logging.getLogger(__name__)

SAMPLERS = ("numpyro", "blackjax")


class CompiledDensity:
    """A model's terms made ready for :func:`sample_on_ranks`: its rows in shared memory
    and its two costs (the rows' terms, the once terms) as one pickled graph.

    Raises
    ------
    synkhronos.extensions.pymc.terms.RowsNotSplittable
        If a term of the rows does not factor over them, naming the term.
    ValueError
        If the model has a discrete free variable (NUTS alone cannot sample it).
    """

    def __init__(self, model: Any):
        self.terms: ModelTerms = split_terms(model)
        if model.discrete_value_vars:
            names = [v.name for v in model.discrete_value_vars]
            raise ValueError(f"a compiled NUTS samples continuous variables only, not {names}")
        self.session = launch.current()
        self.values = list(model.value_vars)
        zero = pt.constant(0.0, dtype="float64")
        rows = pt.add(*[t.sum() for t in self.terms.row_terms])
        once = pt.add(zero, *[t.sum() for t in self.terms.once_terms])
        row_cost, once_cost = with_checks_rewritten(model, [rows, once])
        inputs = self.values + [r.input for r in self.terms.rows]
        inputs += [stand_in for _, stand_in in self.terms.others]
        self.graph = np.frombuffer(pickle.dumps((inputs, row_cost, once_cost)), np.uint8)
        self._seen = [r.value() for r in self.terms.rows]
        self.data = [synk.data(v) for v in self._seen]
        self.times = (0.0, 0.0)  # the last sampling's compile and sampling seconds

    def current_data(self) -> list:
        """The rows in shared memory, those that ``pm.set_data`` replaced copied anew."""
        for k, source in enumerate(self.terms.rows):
            value = source.value()
            if value is not self._seen[k]:
                self.data[k].set_value(value)
                self._seen[k] = value
        return self.data

    def others(self) -> list[np.ndarray]:
        """The current values of the ``pm.Data`` containers that are not rows."""
        return [np.asarray(shared.get_value()) for shared, _ in self.terms.others]


def sample_on_ranks(
    density: CompiledDensity,
    sampler: str,
    *,
    tune: int,
    draws: int,
    chains: int,
    random_seed: int,
    initial_points: list,
    target_accept: float,
    nuts_kwargs: dict,
    chain_method: str = "parallel",
    **_pymc,  # the rest PyMC passes (the model, its logp_fn, progressbar): not needed
) -> tuple[list, dict, Any]:
    """PyMC's ``_sample_numpyro_nuts`` / ``_sample_blackjax_nuts``, run by every rank in one
    program each: returns rank 0's ``(draws by variable, sample stats, the library)``.

    Raises
    ------
    RuntimeError
        If a rank's draws differ from rank 0's.
    """
    import importlib

    # PyMC gives one chain's point unstacked, several chains' stacked.
    inits = [np.asarray(p)[None] if chains == 1 else np.asarray(p) for p in initial_points]
    settings = dict(
        sampler=sampler,
        tune=int(tune),
        draws=int(draws),
        chains=int(chains),
        vectorized=chain_method == "vectorized",
        seed=int(random_seed),
        target_accept=float(target_accept),
        nuts=dict(nuts_kwargs),
        n_values=len(density.values),
        n_rows=len(density.data),
    )
    settings["nuts"].pop("progress_bar", None)
    replies = routines.run(
        nuts_routine,
        text(json.dumps(settings)),
        density.graph,
        *inits,
        *density.current_data(),
        *density.others(),
    )
    mine = replies[0]
    for rank, theirs in enumerate(replies[1:], 1):  # the draws and stats, not the times
        if not all(a.tobytes() == b.tobytes() for a, b in zip(mine[:-1], theirs, strict=False)):
            raise RuntimeError(f"rank {rank}'s draws differ from rank 0's: not one trajectory")
    n = len(density.values)
    stats = dict(zip(STATS, mine[n:-1], strict=True))
    if sampler == "numpyro":  # its steps' count, as PyMC turns it into a tree depth
        stats["tree_depth"] = np.log2(stats["tree_depth"]).astype(int) + 1
    density.times = tuple(float(t) for t in mine[-1])
    logger.info(
        "NUTS on %d ranks: compiled in %.2f s, sampled in %.2f s", len(replies), *density.times
    )
    return mine[:n], stats, importlib.import_module(sampler)


#: The sample stats each program returns, in order (numpyro's tree depth is its steps' count).
STATS = ["lp", "step_size", "n_steps", "tree_depth", "acceptance_rate", "diverging", "energy"]


def nuts_routine(state: Any, settings: np.ndarray, graph: np.ndarray, *arrays: np.ndarray) -> list:
    """(Every rank) compile NUTS over this rank's rows into one program and run it; return
    the draws by variable, the sample stats, and ``[compile seconds, sample seconds]``."""
    config = json.loads(from_text(settings))
    n_values, n_rows = config["n_values"], config["n_rows"]
    inits, rows, others = (
        list(arrays[:n_values]),
        list(arrays[n_values : n_values + n_rows]),
        list(arrays[n_values + n_rows :]),
    )
    ranks = _OnMesh(state.comm) if _on_mesh(state.comm) else _OnHost(state.comm)
    length = rows[0].shape[0]
    lo, hi = ranks.rank * length // ranks.n_ranks, (ranks.rank + 1) * length // ranks.n_ranks
    shares = [np.ascontiguousarray(r[lo:hi]) for r in rows]
    body = _program_body(pickle.loads(bytes(graph)), config, ranks.sum, len(inits))
    results, seconds = ranks.compile_and_run(body, [*inits, *shares, *others])
    return [np.asarray(r) for r in results] + [np.array(seconds)]


def _on_mesh(comm: Any) -> bool:
    """Whether ``comm`` is GPU ranks' (over MPI nodes, its node's own is), whose programs
    run over the ranks' mesh."""
    from synkhronos.transport.comm.xla import XlaCommunicator

    return isinstance(getattr(comm, "local", comm), XlaCommunicator)


class _OnMesh:
    """GPU ranks: the program over the ranks' mesh, summing by collective permutes in rank
    order (:func:`~synkhronos.transport.comm.traced.sum_in_order_traced`)."""

    def __init__(self, comm: Any):
        # Over MPI nodes, the node's own communicator, whose mesh spans every node's ranks.
        self.comm = getattr(comm, "local", comm)
        span = self.comm.span
        self.rank, self.n_ranks = (
            (span.rank, span.n_ranks) if span is not None else (self.comm.rank, self.comm.n_ranks)
        )

    def sum(self, x):
        from synkhronos.transport.comm.traced import sum_in_order_traced

        return sum_in_order_traced(x, self.n_ranks)

    def compile_and_run(self, body, arrays: list) -> tuple[list, list[float]]:
        import jax

        program = self.comm.program(body)
        device = self.comm.to_device(arrays)
        start = time.perf_counter()
        shapes = [
            jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=self.comm.sharding) for a in device
        ]
        compiled = program.lower(shapes, []).compile()
        compiled_at = time.perf_counter()
        results = self.comm.run(compiled, device)
        return results, [compiled_at - start, time.perf_counter() - compiled_at]


class _OnHost:
    """CPU ranks: the program on this rank's JAX CPU device alone, XLA on the rank's
    cores (:func:`jax_cpu_device`), summing by the rank's communicator called back from
    the program (:func:`~synkhronos.transport.comm.traced.sum_by_host_traced`; over MPI
    nodes its all-reduce spans the nodes)."""

    def __init__(self, comm: Any):
        self.comm, self.rank, self.n_ranks = comm, comm.rank, comm.n_ranks
        self.device = jax_cpu_device()
        self.errors: list[BaseException] = []  # what failed a sum, raised instead of JAX's
        self.sites = itertools.count()  # the program's sums, numbered as traced

    def sum(self, x):
        from synkhronos.transport.comm.traced import sum_by_host_traced

        return sum_by_host_traced(x, self.comm, next(self.sites), self.errors)

    def compile_and_run(self, body, arrays: list) -> tuple[list, list[float]]:
        import jax

        placed = [jax.device_put(a, self.device) for a in arrays]
        start = time.perf_counter()
        compiled = jax.jit(body).lower(placed).compile()
        compiled_at = time.perf_counter()
        try:
            results = jax.block_until_ready(compiled(placed))
        except Exception:
            if self.errors:  # a peer's death or failure (Aborted), or this rank's own
                raise self.errors[0] from None
            raise
        return results, [compiled_at - start, time.perf_counter() - compiled_at]


def jax_cpu_device() -> Any:
    """This process's JAX CPU device, JAX's precision set from floatX (as every JAX-mode
    rank sets it, :func:`~synkhronos.rank.backends.jax_compat.match_precision`). XLA
    starts, if it has not, with the settings the session gave this rank: its cores,
    and a worker's JAX on the CPU alone
    (:func:`~synkhronos.session.placement.on_cpu_cores`)."""
    import jax

    from synkhronos.rank.backends.jax_compat import match_precision

    match_precision()
    return jax.devices("cpu")[0]


def _program_body(graph: tuple, config: dict, total, n_values: int):
    """The program: ``[inits..., row shares..., others...] -> [draws..., stats...]``; the
    rows' log-density and gradient summed over the ranks by ``total`` (a traced sum)."""
    import jax
    from pymc.sampling.jax import get_jaxified_graph

    inputs, row_cost, once_cost = graph
    rows_fn = get_jaxified_graph(inputs, [row_cost])
    once_fn = get_jaxified_graph(inputs[:n_values], [once_cost])
    chain = _CHAINS[config["sampler"]]

    def body(arrays: list) -> list:
        inits, data = arrays[:n_values], arrays[n_values:]
        rows_sum = _summed_over_ranks(lambda p: rows_fn(*p, *data)[0], total)

        def logp(position):
            return rows_sum(position) + once_fn(*position)[0]

        keys = jax.random.split(jax.random.PRNGKey(config["seed"]), config["chains"])

        def one(key_and_init):
            return chain(logp, key_and_init[0], list(key_and_init[1]), config)

        each = jax.vmap(one) if config["vectorized"] else functools.partial(jax.lax.map, one)
        draws, stats = each((keys, inits))
        return [*draws, *stats]

    return body


def _summed_over_ranks(own, total):
    """(Traced) ``own`` (a rank's rows' log-density of a position) summed over the ranks
    by ``total``, its gradient the sum of theirs. Differentiated by JAX, a collective's
    gradient in a program over the mesh that does not track which values are replicated
    (``check_vma=False``) is each rank's own gradient times the ranks' count: each rank
    would step by its own rows; a host callback's has none. So the value and the gradient
    are computed together and summed at once, one sum per evaluation."""
    import jax
    from jax.flatten_util import ravel_pytree

    def summed(position):
        value, grad = jax.value_and_grad(own)(position)
        flat, unravel = ravel_pytree(grad)
        both = total(jax.numpy.concatenate([value[None], flat]))
        return both[0], unravel(both[1:])

    @jax.custom_vjp
    def rows_sum(position):
        return total(own(position)[None])[0]

    def backward(grad, cotangent):
        return (jax.tree_util.tree_map(lambda g: cotangent * g, grad),)

    rows_sum.defvjp(summed, backward)  # summed: the value, and the gradient kept for backward
    return rows_sum


def _numpyro_chain(logp, key, init: list, config: dict) -> tuple[list, list]:
    """One chain of numpyro's NUTS (its warm-up adaptation, then the draws)."""
    from jax import lax
    from numpyro.infer.hmc import hmc

    init_kernel, sample_kernel = hmc(potential_fn=lambda p: -logp(p), algo="NUTS")
    nuts = {"dense_mass": False} | config["nuts"]
    start = init_kernel(
        init,
        config["tune"],
        target_accept_prob=config["target_accept"],
        rng_key=key,
        **nuts,
    )
    tuned = lax.fori_loop(0, config["tune"], lambda _, s: sample_kernel(s), start)

    def step(s, _):
        s = sample_kernel(s)
        steps = s.num_steps
        stats = [s.potential_energy, s.adapt_state.step_size, steps, steps, s.accept_prob]
        return s, (s.z, [*stats, s.diverging, s.energy])

    _, (draws, stats) = lax.scan(step, tuned, None, length=config["draws"])
    return list(draws), stats


def _blackjax_chain(logp, key, init: list, config: dict) -> tuple[list, list]:
    """One chain of blackjax's NUTS after its window adaptation."""
    import blackjax
    import jax
    from blackjax.adaptation.base import get_filter_adapt_info_fn
    from jax import lax

    warm_key, draw_key = jax.random.split(key)
    warmup = blackjax.window_adaptation(
        blackjax.nuts,
        logp,
        target_acceptance_rate=config["target_accept"],
        adaptation_info_fn=get_filter_adapt_info_fn(),
        **config["nuts"],
    )
    (tuned, params), _ = warmup.run(warm_key, init, num_steps=config["tune"])
    kernel = blackjax.nuts(logp, **params).step

    def step(s, k):
        s, info = kernel(k, s)
        stats = [s.logdensity, params["step_size"], info.num_integration_steps]
        stats += [info.num_trajectory_expansions, info.acceptance_rate]
        return s, (s.position, [*stats, info.is_divergent, info.energy])

    _, (draws, stats) = lax.scan(step, tuned, jax.random.split(draw_key, config["draws"]))
    return list(draws), stats


_CHAINS = {"numpyro": _numpyro_chain, "blackjax": _blackjax_chain}

__all__ = ["SAMPLERS", "CompiledDensity", "nuts_routine", "sample_on_ranks"]
