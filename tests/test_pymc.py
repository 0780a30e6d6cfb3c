"""PyMC models on N ranks: the split log-density and gradient equal PyMC's own, float64,
on 2 and 3 ranks with uneven rows; refused models; sampling gives PyMC's posterior."""

from __future__ import annotations

import re

import numpy as np
import pytensor.tensor as pt
import pytest

pm = pytest.importorskip("pymc")  # PyMC 6 needs Python 3.12: skipped on 3.11

from synkhronos.extensions import pymc as synk_pymc  # noqa: E402 - after the skip

ROWS = 29  # uneven on 2 and on 3 ranks


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


@pytest.mark.parametrize("ranks", [2, 3], indirect=True)
@pytest.mark.parametrize("build", [logistic, hierarchical, centered, with_data])
def test_logp_and_gradient_equal_pymc(ranks, build, rng):
    model = build(rng)
    split = synk_pymc.logp_dlogp_function(model)
    assert len(split.terms.once_terms) == len(model.free_RVs)  # the priors, computed once
    assert_same(model, split, rng)


@pytest.mark.parametrize("ranks", [2, 3], indirect=True)
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
    ],
)
def test_refused_models_name_the_term(kind, says):
    with pytest.raises(synk_pymc.RowsNotSplittable, match=re.escape(says)):
        synk_pymc.logp_dlogp_function(refused(kind))


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_sample_gives_pymc_posterior(ranks):
    rng = np.random.default_rng(1)
    model = logistic(rng, n=101)
    settings = dict(draws=150, tune=150, chains=2, random_seed=7, progressbar=False)
    with model:
        split = synk_pymc.sample(**settings)
        own = pm.sample(cores=1, **settings)
    import arviz as az

    mean = split.posterior["b"].mean(("chain", "draw")).values
    want = own.posterior["b"].mean(("chain", "draw")).values
    mcse = az.mcse(own, var_names=["b"])["b"].values
    assert np.all(np.abs(mean - want) <= 4 * mcse), (mean, want, mcse)
    assert split.posterior["b"].shape == own.posterior["b"].shape


def test_sample_refuses_parallel_chains():
    with pytest.raises(ValueError, match="cores=1"):
        synk_pymc.sample(model=logistic(np.random.default_rng(0)), cores=2)
