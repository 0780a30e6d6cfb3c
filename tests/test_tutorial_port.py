"""What the Theano tutorials need of the port beyond their imports (issue #61):
``theano.In(var, value=...)`` takes its default where a call omits the argument, each
call anew, and ``--check`` names each truth test of a parameter that defaults to None
(``if not W:``), which raises on a PyTensor variable."""

import numpy as np
import pytest

from synkhronos import theano
from synkhronos.tools.porting import find_gaps

TUTORIAL_LIKE = """\
import numpy
import theano
from theano.tensor.shared_randomstreams import RandomStreams


class dA(object):
    def __init__(self, numpy_rng, theano_rng=None, input=None, W=None, bhid=None, n=3):
        if not theano_rng:
            theano_rng = RandomStreams(numpy_rng.randint(2 ** 30))
        if not W:
            W = theano.shared(numpy.zeros((n, 2)), name="W")
        if bhid is None or n:
            bhid = W if W else 1
        self.W = W


def plain(x=None):
    return not x  # no Theano import needed to flag it: this file has one
"""


def test_truth_tests_of_optional_parameters_are_named():
    gaps = [(g.line, g.name) for g in find_gaps(TUTORIAL_LIKE)]
    assert gaps == [(8, "theano_rng"), (10, "W"), (13, "W"), (18, "x")]
    assert "`W is None`" in str(find_gaps(TUTORIAL_LIKE)[1])


def test_truth_tests_outside_theano_programs_are_not_named():
    assert find_gaps("def f(x=None):\n    return not x\n") == []


def test_in_with_a_default_each_call():
    T = theano.tensor
    a, level = T.scalar("a"), T.scalar("level")
    f = theano.function([a, theano.In(level, value=0.2)], a * level)
    assert np.isclose(f(2.0), 0.4)
    assert np.isclose(f(2.0, 0.5), 1.0)
    assert np.isclose(f(2.0), 0.4)  # the default again, not the last value
    assert np.isclose(f(2.0, level=0.25), 0.5)
    assert f.maker is not None  # the compiled function's attributes


def test_in_refuses_what_synk_function_cannot_take():
    import synkhronos as synk

    a = theano.tensor.vector("a")
    with pytest.raises(TypeError, match="update or implicit value"):
        synk.function([theano.In(a, update=a * 2)], a.sum())
