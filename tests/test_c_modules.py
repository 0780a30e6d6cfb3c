"""A graph's C modules compiled by the ranks, each its share (:mod:`synkhronos.rank.c_modules`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.maker import FunctionMaker
from pytensor.compile.mode import get_mode
from pytensor.compile.rebuild import construct_function_ins_and_outs
from pytensor.link.c.cmodule import GCC_compiler

from synkhronos.rank import c_modules
from synkhronos.rank.c_modules import compile_share

pytestmark = pytest.mark.skipif(not pytensor.config.cxx, reason="no C compiler")


def _maker(rng):
    """A rewritten CVM graph whose fused ops hold constants drawn here, so that no cache
    has their modules: ``(maker, inputs' values, numpy's outputs)``."""
    x, m = pt.vector("x"), pt.matrix("m")
    c = np.random.default_rng().uniform(1.0, 2.0, size=3)  # unseeded: new in every run
    outputs = [pt.exp(x * c[0]) + c[1], pt.tanh(m - c[2]) * c[0]]
    mode = get_mode("CVM")
    ins, cloned = construct_function_ins_and_outs([x, m], outputs)
    maker = mode.function_maker(ins, [FunctionMaker.wrap_out(o) for o in cloned], mode)
    values = [rng.standard_normal(5), rng.standard_normal((2, 3))]
    want = [np.exp(values[0] * c[0]) + c[1], np.tanh(values[1] - c[2]) * c[0]]
    return maker, values, want


def _scratch() -> Path:
    # On the compile folder's file system, as the ranks' is (a module folder is moved).
    return Path(pytensor.config.compiledir) / "synkhronos-graphs"


def test_the_ranks_compile_their_shares_and_the_link_compiles_nothing(rng, monkeypatch):
    maker, values, want = _maker(rng)
    shares = [compile_share(maker.fgraph, index, 2, _scratch()) for index in range(2)]
    assert min(shares) >= 1, shares  # two new modules at least: one for each rank
    assert compile_share(maker.fgraph, 0, 2, _scratch()) == 0  # now the cache has them

    def refuse(*args, **kwargs):
        raise AssertionError("the link compiled a module")

    monkeypatch.setattr(GCC_compiler, "compile_str", staticmethod(refuse))
    got = maker.create()(*values)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_a_rank_alone_compiles_every_module_as_long_as_told(rng, monkeypatch):
    maker, values, want = _maker(rng)
    assert compile_share(maker.fgraph, 0, 1, _scratch(), keep_going=lambda: False) == 0
    assert compile_share(maker.fgraph, 0, 1, _scratch()) >= 2

    def refuse(*args, **kwargs):
        raise AssertionError("the link compiled a module")

    monkeypatch.setattr(GCC_compiler, "compile_str", staticmethod(refuse))
    for g, w in zip(maker.create()(*values), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_a_module_that_fails_to_compile_is_left_to_the_link(rng, monkeypatch):
    maker, values, want = _maker(rng)

    def fail(*args, **kwargs):
        raise OSError("no compiler here")

    with monkeypatch.context() as patch:
        patch.setattr(GCC_compiler, "compile_str", staticmethod(fail))
        assert compile_share(maker.fgraph, 0, 2, _scratch()) == 0
    for g, w in zip(maker.create()(*values), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_modules_are_dealt_out_evenly_by_the_length_of_their_code(rng):
    lengths = [int(n) for n in rng.integers(5_000, 150_000, size=49)]
    for count in (1, 2, 3, 5):
        ranks = c_modules.deal(lengths, count)
        assert ranks == c_modules.deal(list(lengths), count)  # the same on every rank
        assert set(ranks) == set(range(count))
        loads = [
            sum(c_modules._FIXED_COST + n for n, r in zip(lengths, ranks, strict=True) if r == k)
            for k in range(count)
        ]
        # Greedy, longest first: no rank has more than one module's work beyond another.
        assert max(loads) - min(loads) <= c_modules._FIXED_COST + max(lengths)
    # Every n-th by position would give both long modules to rank 0.
    assert c_modules.deal([100_000, 1, 100_000, 1], 2) == [0, 0, 1, 1]
