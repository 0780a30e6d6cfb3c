"""PyMC models on N ranks: the split log-density and gradient equal PyMC's own, float64,
on 2 and 3 CPU ranks and 2 GPU ranks (JAX mode; CPU devices where there is no GPU) with
uneven rows, and on 2 MPI nodes; refused models; sampling gives PyMC's posterior."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

pm = pytest.importorskip("pymc")  # PyMC 6 needs Python 3.12: skipped on 3.11

import synkhronos as synk  # noqa: E402 - after the skip
from synkhronos.extensions import pymc as synk_pymc  # noqa: E402
from synkhronos.rank.backends import gpu  # noqa: E402
from synkhronos.session import launch  # noqa: E402
from tests.test_nodes import MPIEXEC, _launch  # noqa: E402

ROWS = 29  # uneven on 2 and on 3 ranks


@pytest.fixture(scope="module")
def ranks(request):
    """2 or 3 CPU ranks, or "gpu" ("gpu3"): 2 (3) GPU ranks in float64. PYTENSOR_FLAGS
    naming floatX keeps the fork from making it float32 (its GPU default), and the fork
    then turns JAX's 64-bit mode on, on rank 0 and the workers."""
    param = getattr(request, "param", 2)
    if param not in ("gpu", "gpu3"):
        synk.fork(param, backend="cpu")
        yield param
        synk.close()
        return
    pytest.importorskip("jax")
    if not gpu.on_cpu_devices() and len(gpu.visible_gpus()) < 2:
        pytest.skip("needs 2 GPUs")
    assert pytensor.config.floatX == "float64"
    flags = [f for f in (os.environ.get("PYTENSOR_FLAGS"), "floatX=float64") if f]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTENSOR_FLAGS", ",".join(flags))
        n_ranks = 3 if param == "gpu3" else 2
        synk.fork(n_ranks, backend="gpu")
        import jax

        assert launch.current().backend.name == "gpu"
        assert jax.config.read("jax_enable_x64")
        yield n_ranks
        synk.close()


def logistic(rng, n=ROWS, k=3):
    x = rng.normal(size=(n, k))
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ np.linspace(1, -1, k)))).astype("int64")
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=k)
        pm.Bernoulli("y", logit_p=x @ b, observed=y)
    return model


def hierarchical(rng, n=ROWS, groups=4):
    g = rng.integers(0, groups, n)
    x, y = rng.normal(size=n), rng.normal(size=n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        a = pm.Normal("a", mu, tau, shape=groups)  # one per group; the rows index them
        slope = pm.Normal("slope", 0, 1)
        sigma = pm.Exponential("sigma", 1)
        pm.Normal("y", a[g] + slope * x, sigma, observed=y)
    return model


def centered(rng, n=ROWS):
    """A statistic of the data (the covariate's mean) is the whole data's on every rank."""
    x, y = rng.normal(size=n), rng.normal(size=n)
    with pm.Model() as model:
        slope = pm.Normal("slope", 0, 1)
        pm.Normal("y", slope * (x - x.mean()), 1.0, observed=y)
    return model


def with_data(rng, n=ROWS, groups=3):
    """Rows in pm.Data (covariates, a group index, the observed values) and a group-level
    pm.Data that is not the rows'."""
    with pm.Model() as model:
        x = pm.Data("x", rng.normal(size=(n, 2)))
        g = pm.Data("g", rng.integers(0, groups, n))
        level = pm.Data("level", rng.normal(size=groups))
        y = pm.Data("y_obs", rng.normal(size=n))
        b = pm.Normal("b", 0, 1, shape=2)
        sigma = pm.HalfNormal("sigma", 1)
        pm.StudentT("y", nu=4, mu=x @ b + level[g], sigma=sigma, observed=y)
    return model


def assert_same(model, split, rng, points=3):
    """The split function equals PyMC's own at random points, within 1e-12 relative."""
    pymc_own = model.logp_dlogp_function(ravel_inputs=True)
    size = sum(np.size(v) for v in model.initial_point().values())
    for _ in range(points):
        q = rng.normal(size=size)
        logp, grad = split(q)
        want_logp, want_grad = pymc_own([q], extra_vars={})
        assert abs(logp - want_logp) <= 1e-12 * abs(want_logp)
        assert np.max(np.abs(grad - want_grad)) <= 1e-12 * np.max(np.abs(want_grad))


@pytest.mark.parametrize("ranks", [2, 3, pytest.param("gpu", marks=pytest.mark.gpu)], indirect=True)
@pytest.mark.parametrize("build", [logistic, hierarchical, centered, with_data])
def test_logp_and_gradient_equal_pymc(ranks, build, rng):
    model = build(rng)
    split = synk_pymc.logp_dlogp_function(model)
    assert len(split.terms.once_terms) == len(model.free_RVs)  # the priors, computed once
    assert_same(model, split, rng)


def mixture(form):
    """A two-component mixture over the rows, in one of PyMC's five spellings."""

    def build(rng, n=ROWS):
        y = np.concatenate([rng.normal(-2, 1, n // 2), rng.normal(2, 1, n - n // 2)])
        shape = {"shape": n} if form.endswith("_shape") else {}
        with pm.Model() as model:
            w = pm.Dirichlet("w", np.ones(2))
            mu = pm.Normal("mu", 0, 3, shape=2)
            sigma = pm.HalfNormal("sigma", 1)
            if form.startswith("normal_mixture"):
                pm.NormalMixture("y", w=w, mu=mu, sigma=sigma, observed=y, **shape)
            elif form.startswith("list"):
                parts = [pm.Normal.dist(mu[k], sigma, **shape) for k in range(2)]
                pm.Mixture("y", w=w, comp_dists=parts, observed=y)
            else:  # one batched component distribution
                pm.Mixture("y", w=w, comp_dists=pm.Normal.dist(mu, sigma), observed=y)
        return model

    build.__name__ = f"mixture_{form}"
    return build


MIXTURES = ["normal_mixture", "normal_mixture_shape", "list", "list_shape", "batched"]


@pytest.mark.parametrize("ranks", [2, 3], indirect=True)
@pytest.mark.parametrize("form", MIXTURES)
def test_mixtures_split_exactly(ranks, form, rng):
    """A mixture's log-density is a log-sum-exp over the components in each row: a sum
    over the rows, split as any other (it was refused, for a SpecifyShape of the whole
    rows' count that copying the log-sum-exp's node made)."""
    model = mixture(form)(rng)
    split = synk_pymc.logp_dlogp_function(model)
    assert len(split.terms.row_terms) == 1
    assert_same(model, split, rng)


@pytest.mark.parametrize("ranks", [2, 3, pytest.param("gpu", marks=pytest.mark.gpu)], indirect=True)
def test_set_data_reaches_the_ranks(ranks, rng):
    model = with_data(rng)
    split = synk_pymc.logp_dlogp_function(model)
    assert_same(model, split, rng, points=1)
    for n in (17, 41):  # fewer rows, then more than shared memory held
        new = {
            "x": rng.normal(size=(n, 2)),
            "g": rng.integers(0, 3, n),
            "y_obs": rng.normal(size=n),
        }
        pm.set_data(new | {"level": rng.normal(size=3)}, model=model)
        assert_same(model, split, rng, points=2)


def refused(kind):
    rng = np.random.default_rng(0)
    y = rng.normal(size=ROWS)
    with pm.Model() as model:
        if kind == "covariance":
            pm.MvNormal("y", mu=np.zeros(ROWS), cov=np.eye(ROWS), observed=y)
        elif kind == "walk":
            pm.GaussianRandomWalk("y", sigma=1.0, init_dist=pm.Normal.dist(), observed=y)
        elif kind == "lengths":
            pm.Normal("y", observed=y)
            pm.Normal("z", observed=y[:-2])
        elif kind == "per_row":  # a latent value per row
            z = pm.Normal("z", 0, 1, shape=ROWS)
            pm.Normal("y", z + rng.normal(size=ROWS), 1.0, observed=y)
        elif kind == "per_row_scale":  # sized by a pm.Data's rows, on the log scale
            x = pm.Data("x", rng.normal(size=ROWS))
            s = pm.HalfNormal("s", shape=x.shape[0])
            pm.Normal("y", x, s, observed=y)
        elif kind == "per_rows":  # a latent location and scale per row, and groups
            z = pm.Normal("z", 0, 1, shape=ROWS)
            s = pm.HalfNormal("s", shape=ROWS)
            a = pm.Normal("a", 0, 1, shape=ROWS)  # as many groups as rows: not per row
            pm.Normal("y", z + a[rng.integers(0, ROWS, ROWS)], s, observed=y)
        else:
            b = pm.Normal("b")
            pm.Normal("y", pt.cumsum(b * rng.normal(size=ROWS)), 1.0, observed=y)
    return model


@pytest.mark.parametrize(
    "kind, says",
    [
        ("covariance", "'y' (multivariate_normal) is one term of all 29 rows"),
        ("walk", "'y' (RandomWalkRV) is one term of all 29 rows"),
        ("mixing", "'y' (normal) does not factor over the rows: a cumulative add"),
        ("lengths", "the observed values have different numbers of rows ({'y': 29, 'z': 27})"),
        ("per_row", "'y' (normal) reads the free variable 'z', which has one value per row (29)"),
        ("per_row_scale", "reads the free variable 's', which has one value per row (29)"),
        ("per_rows", "reads the free variables 's', 'z', each of which has one value per row"),
    ],
)
@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_refused_models_name_the_term(ranks, kind, says):
    with pytest.raises(synk_pymc.RowsNotSplittable, match=re.escape(says)):
        synk_pymc.logp_dlogp_function(refused(kind))


def test_refused_models_need_no_session(monkeypatch):
    """A model that cannot be split is refused as such, not for want of a fork."""
    monkeypatch.setattr(launch, "_session", None)  # (the module's ranks may be running)
    with pytest.raises(synk_pymc.RowsNotSplittable, match="one term of all 29 rows"):
        synk_pymc.logp_dlogp_function(refused("covariance"))
    with pytest.raises(RuntimeError, match="synk.fork"):
        synk_pymc.logp_dlogp_function(logistic(np.random.default_rng(0)))


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_as_many_groups_as_rows_is_not_a_variable_per_row(ranks, rng):
    """A group-level variable of the rows' length that the rows index stays whole."""
    model = hierarchical(rng, groups=ROWS)
    assert_same(model, synk_pymc.logp_dlogp_function(model), rng)


@pytest.mark.parametrize("ranks", [2, pytest.param("gpu", marks=pytest.mark.gpu)], indirect=True)
def test_sample_gives_pymc_posterior(ranks):
    rng = np.random.default_rng(1)
    model = logistic(rng, n=101)
    settings = dict(draws=150, tune=150, chains=2, random_seed=7, progressbar=False)
    with model:
        split = synk_pymc.sample(min_rows=0, **settings)
        own = pm.sample(cores=1, **settings)
    import arviz as az

    mean = split.posterior["b"].mean(("chain", "draw")).values
    want = own.posterior["b"].mean(("chain", "draw")).values
    mcse = az.mcse(own, var_names=["b"])["b"].values
    assert np.all(np.abs(mean - want) <= 4 * mcse), (mean, want, mcse)
    assert split.posterior["b"].shape == own.posterior["b"].shape


@functools.cache
def numpyro_reference(chain_method: str) -> tuple[np.ndarray, np.ndarray]:
    """``pm.sample(nuts_sampler="numpyro")``'s posterior means of :func:`compiled_case`'s
    ``b`` and their Monte-Carlo standard errors."""
    import arviz as az

    model, settings = compiled_case(chain_method)
    with model:
        own = pm.sample(nuts_sampler="numpyro", **settings)
    mcse = az.mcse(own, var_names=["b"])["b"].values
    return own.posterior["b"].mean(("chain", "draw")).values, mcse


def compiled_case(chain_method: str) -> tuple:
    """The model and settings the compiled NUTS is tested on: 2 chains."""
    settings = dict(draws=150, tune=150, chains=2, random_seed=7, progressbar=False)
    settings["nuts"] = {"chain_method": chain_method}
    return logistic(np.random.default_rng(1), n=101), settings


@pytest.mark.parametrize(
    ("ranks", "sampler", "chain_method"),
    [
        (2, "numpyro", "parallel"),
        (3, "blackjax", "vectorized"),
        pytest.param("gpu", "numpyro", "parallel", marks=pytest.mark.gpu),
        pytest.param("gpu", "blackjax", "vectorized", marks=pytest.mark.gpu),
    ],
    indirect=["ranks"],
)
def test_compiled_nuts_gives_pymc_posterior(ranks, sampler, chain_method, monkeypatch):
    """numpyro's and blackjax's NUTS compiled whole on each rank, its rows' terms summed
    inside the program (GPU ranks: by collectives over the mesh; CPU ranks: by the
    communicator, called back from the program), 2 chains one after another
    ("parallel", PyMC's default: numpyro's on one device) or together ("vectorized"):
    the posterior means are within 4 Monte-Carlo standard errors of
    ``pm.sample(nuts_sampler="numpyro")``'s, and every rank drew the same draws (rank 0
    compares them bit for bit; here the other ranks' replies are kept to see)."""
    pytest.importorskip(sampler)
    from synkhronos.api import routines

    replies, run = [], routines.run
    monkeypatch.setattr(routines, "run", lambda *a: replies.append(run(*a)) or replies[-1])
    model, settings = compiled_case(chain_method)
    with model:
        split = synk_pymc.sample(nuts_sampler=sampler, min_rows=0, **settings)
    # PyMC 6.4's own blackjax path fails with blackjax 1.7 (it hands the window
    # adaptation a progress_bar argument): numpyro's draws are the reference for both.
    want, mcse = numpyro_reference(chain_method)
    mean = split.posterior["b"].mean(("chain", "draw")).values
    assert np.all(np.abs(mean - want) <= 4 * mcse), (mean, want, mcse)
    assert split.posterior["b"].shape == (2, 150, 3)
    assert {"lp", "step_size", "n_steps", "diverging"} <= set(split.sample_stats.data_vars)
    (by_rank,) = replies
    assert len(by_rank) == ranks
    assert all(np.array_equal(by_rank[0][0], theirs[0]) for theirs in by_rank[1:])
    assert split.posterior.attrs["synk_sampling_s"] > 0


def summed_routine(state, parts: np.ndarray) -> list:
    """(Every GPU rank) the compiled NUTS's sum over the ranks of each rank's row of
    ``parts``."""
    from jax import lax

    from synkhronos.transport.comm.traced import AXIS, sum_in_order_traced

    comm, n_ranks = state.comm, len(parts)
    program = comm.program(lambda a: [sum_in_order_traced(a[0][lax.axis_index(AXIS)], n_ranks)])
    return [np.asarray(r) for r in comm.run(program, comm.to_device([parts]))]


@pytest.mark.parametrize(
    "ranks",
    [pytest.param("gpu", marks=pytest.mark.gpu), pytest.param("gpu3", marks=pytest.mark.gpu)],
    indirect=True,
)
def test_compiled_sum_is_in_rank_order_on_every_rank(ranks):
    """The log-density's sum over the ranks in the compiled NUTS adds rank 0's part first,
    then rank 1's...: on 3 ranks 1e16 + 1 - 1e16 is 0 in that order, 1 in some others;
    every rank gets the same bits."""
    from synkhronos.api import routines

    parts = np.array([[1e16, 2.5], [1.0, -0.5], [-1e16, 1e-3]])[:ranks]
    want = parts[0].copy()
    for part in parts[1:]:
        want = want + part
    replies = routines.run(summed_routine, parts)
    assert all(r[0].tobytes() == want.tobytes() for r in replies), (replies, want)


@pytest.fixture
def split_calls(monkeypatch) -> list:
    """The points at which the split log-density was evaluated, appended as it is."""
    own, calls = synk_pymc.SplitDensity._pytensor_function, []

    def counted(self, q):
        calls.append(q)
        return own(self, q)

    monkeypatch.setattr(synk_pymc.SplitDensity, "_pytensor_function", counted)
    return calls


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_sample_splits_whatever_is_installed(ranks, split_calls):
    """With nutpie installed, PyMC's own default sampler is nutpie, which compiles the
    log-density itself: ``sample()`` without ``nuts_sampler`` (nutpie, calling the split
    function) must still split it; with a discrete variable, PyMC's NUTS beside its
    Metropolis step, the continuous variables' evaluations split."""
    pytest.importorskip("nutpie")
    import pymc.sampling.mcmc

    assert pymc.sampling.mcmc.NUTPIE_INSTALLED
    calls = split_calls
    settings = dict(draws=5, tune=5, chains=1, random_seed=7, progressbar=False)
    with logistic(np.random.default_rng(1), n=101):
        idata = synk_pymc.sample(min_rows=0, **settings)
    assert idata.posterior["b"].shape == (1, 5, 3)
    assert len(calls) >= 10  # every step of NUTS evaluated the split function
    assert idata.posterior.attrs["inference_library"] == "nutpie"
    calls.clear()
    rng = np.random.default_rng(2)
    with pm.Model():
        switch = pm.Bernoulli("switch", 0.5)
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu + switch, 1.0, observed=rng.normal(size=101))
        idata = synk_pymc.sample(min_rows=0, **settings)
    assert idata.posterior["mu"].shape == (1, 5) and len(calls) >= 10


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_few_rows_sample_unsplit_and_say_so(ranks, split_calls, caplog):
    """Below ``MIN_ROWS`` rows ``sample`` is ``pm.sample`` with the same sampler, unsplit
    (the same draws), and a warning says so once; ``min_rows`` moves the threshold."""
    pytest.importorskip("nutpie")
    settings = dict(draws=20, tune=20, chains=1, random_seed=7, progressbar=False)
    assert synk_pymc.MIN_ROWS["cpu"]["nutpie"] > 101
    with (
        logistic(np.random.default_rng(1), n=101) as model,
        caplog.at_level(logging.WARNING, logger="synkhronos.extensions.pymc"),
    ):
        unsplit = synk_pymc.sample(**settings)
        synk_pymc.sample(**settings)
        own = pm.sample(nuts_sampler="nutpie", cores=1, **settings)
    assert not split_calls
    said = [r.getMessage() for r in caplog.records if "sampling unsplit" in r.getMessage()]
    assert len(said) == 1, said
    assert f"101 rows, fewer than min_rows={synk_pymc.MIN_ROWS['cpu']['nutpie']}" in said[0]
    assert np.array_equal(unsplit.posterior["b"], own.posterior["b"])
    synk_pymc.sample(model=model, nuts_sampler="pymc", min_rows=101, **settings)
    assert len(split_calls) >= 40  # 101 rows, min_rows=101: split


@pytest.mark.parametrize("ranks", [2, pytest.param("gpu", marks=pytest.mark.gpu)], indirect=True)
def test_compiled_nuts_runs_unsplit_below_its_threshold(ranks, caplog, monkeypatch):
    """Below ``MIN_ROWS[backend]["numpyro"]`` rows (here 101) ``sample`` is
    ``pm.sample(nuts_sampler="numpyro")`` itself, unsplit, on CPU and GPU ranks alike, no
    rank's routine, and says so. (``pm.sample`` is a stand-in here: PyMC's numpyro
    sampling in this process would start JAX with the 100 host devices PyMC forces.)"""
    from synkhronos.api import routines

    routines_run: list = []
    monkeypatch.setattr(routines, "run", lambda *a: routines_run.append(a))
    monkeypatch.setattr(pm, "sample", lambda *a, **kw: ("pm.sample", kw["nuts_sampler"]))
    with (
        logistic(np.random.default_rng(1), n=101),
        caplog.at_level(logging.WARNING, logger="synkhronos.extensions.pymc"),
    ):
        assert synk_pymc.sample(nuts_sampler="numpyro") == ("pm.sample", "numpyro")
    assert not routines_run
    said = [r.getMessage() for r in caplog.records if "sampling unsplit" in r.getMessage()]
    assert len(said) == 1, said
    backend = launch.current().backend.name
    assert f"fewer than min_rows={synk_pymc.MIN_ROWS[backend]['numpyro']} " in said[0], said


@pytest.mark.parametrize("ranks", [2, 3], indirect=True)
def test_nutpie_calls_the_split_function(ranks, split_calls):
    """nutpie's NUTS calling the split function: posterior means within 4 Monte-Carlo
    standard errors of ``pm.sample``'s with nutpie, and every evaluation split."""
    import arviz as az

    pytest.importorskip("nutpie")
    calls = split_calls
    settings = dict(draws=100, tune=100, chains=2, random_seed=7, progressbar=False)
    with logistic(np.random.default_rng(1), n=101):
        split = synk_pymc.sample(nuts_sampler="nutpie", min_rows=0, **settings)
        assert len(calls) >= 400  # 2 chains of 200 steps, each at least one evaluation
        reference = pm.sample(nuts_sampler="nutpie", **settings)
    assert split.posterior["b"].shape == reference.posterior["b"].shape == (2, 100, 3)
    mean = split.posterior["b"].mean(("chain", "draw")).values
    want = reference.posterior["b"].mean(("chain", "draw")).values
    mcse = az.mcse(reference, var_names=["b"])["b"].values
    assert np.all(np.abs(mean - want) <= 4 * mcse), (mean, want, mcse)


def test_sample_refuses_an_unknown_sampler():
    with pytest.raises(ValueError, match="not nuts_sampler='stan'"):
        synk_pymc.sample(model=logistic(np.random.default_rng(0)), nuts_sampler="stan")


def test_sample_refuses_parallel_chains():
    with pytest.raises(ValueError, match="cores=1"):
        synk_pymc.sample(model=logistic(np.random.default_rng(0)), cores=2)


NODES = r"""
import os
import sys

os.environ["PYTENSOR_FLAGS"] += ",floatX=float64"  # GPU ranks too (the fork keeps it)
import arviz as az
import numpy as np
import pymc as pm

import synkhronos as synk
from synkhronos.extensions import pymc as synk_pymc
from synkhronos.transport import nodes
from tests.test_pymc import assert_same, hierarchical, logistic, with_data

synk.fork(int(sys.argv[1]), backend=sys.argv[2])
world = nodes.current()
rng = np.random.default_rng(0)  # the same data and points on every node
for build in (logistic, hierarchical):
    model = build(rng)
    assert_same(model, synk_pymc.logp_dlogp_function(model), rng)
model = with_data(rng)
split = synk_pymc.logp_dlogp_function(model)
for n in (17, 41):
    new = {"x": rng.normal(size=(n, 2)), "g": rng.integers(0, 3, n), "y_obs": rng.normal(size=n)}
    pm.set_data(new | {"level": rng.normal(size=3)}, model=model)
    assert_same(model, split, rng, points=2)
settings = dict(draws=60, tune=60, chains=1, random_seed=7, progressbar=False)
with logistic(np.random.default_rng(1), n=101):
    mean = synk_pymc.sample(min_rows=0, **settings).posterior["b"].mean(("chain", "draw")).values
    own = pm.sample(cores=1, **settings)
want = own.posterior["b"].mean(("chain", "draw")).values
assert np.all(np.abs(mean - want) <= 4 * az.mcse(own, var_names=["b"])["b"].values)
print(f"node {world.node} of {world.n_global} ranks: ok, means {mean.tobytes().hex()}", flush=True)
if sys.argv[2] == "gpu" or sys.argv[1] == "2":  # NUTS compiled whole, summed over every node
    with logistic(np.random.default_rng(1), n=101):
        compiled = synk_pymc.sample(nuts_sampler="numpyro", min_rows=0, **settings)
    mean = compiled.posterior["b"].mean(("chain", "draw")).values
    assert np.all(np.abs(mean - want) <= 4 * az.mcse(own, var_names=["b"])["b"].values)
    print(f"node {world.node}: compiled means {mean.tobytes().hex()}", flush=True)
synk.close()
"""


@pytest.mark.skipif(
    not MPIEXEC.exists() or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpi4py and mpiexec next to the interpreter (pip install 'synkhronos[mpi]' mpich)",
)
@pytest.mark.parametrize(("local", "backend"), [(1, "cpu"), (2, "cpu"), (2, "gpu")])
def test_nodes_give_pymc_own(tmp_path, local, backend, monkeypatch):
    """2 MPI nodes of ``local`` ranks (GPU ranks on CPU devices): the log-density and
    gradient equal PyMC's own within 1e-12, also after ``pm.set_data``, and a short
    sampling's posterior means are within 4 Monte-Carlo standard errors of ``pm.sample``'s
    and bit-identical on both nodes (their NUTS took the same steps); on GPU ranks, so are
    numpyro's NUTS compiled whole (on 2 CPU ranks a node too), its sums over the ranks of
    both nodes."""
    if backend == "gpu" and importlib.util.find_spec("jax") is None:
        pytest.skip("needs jax")
    # An earlier test's numpyro sampling imported pymc.sampling.jax, which forces 100 host
    # devices in XLA_FLAGS: the nodes inherit it, and each rank must still be one device.
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=100")
    proc, _ = _launch(tmp_path, NODES, str(local), backend, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    means = set(re.findall(rf"node [01] of {2 * local} ranks: ok, means ([0-9a-f]+)", out))
    assert len(re.findall(rf"node [01] of {2 * local} ranks: ok", out)) == 2, out
    assert len(means) == 1, out
    if backend == "gpu" or local == 2:  # numpyro's NUTS compiled whole: the same draws
        compiled = re.findall(r"node [01]: compiled means ([0-9a-f]+)", out)
        assert len(compiled) == 2 and len(set(compiled)) == 1, out
