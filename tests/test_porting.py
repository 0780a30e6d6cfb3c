"""``python -m synkhronos port``: every Theano/Lasagne import form rewritten, everything
else byte for byte, the names the port lacks reported with their lines, Python 2 refused
with a message, and a ported program that runs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from synkhronos.tools.porting import find_gaps, port_source

# Every import form of Theano-era programs (the original Synkhronos' demos, Lasagne's
# examples and Recipes), with comments and odd spacing that must survive.
ORIGINAL = """\
# -*- coding: utf-8 -*-
\"\"\"A program: "import theano" in a docstring stays.\"\"\"
from __future__ import print_function
import os, theano  # two modules, one line
import theano.tensor as T
import theano.tensor.nnet   as   nnet
import theano.sandbox.rng_mrg
import theano.gpuarray
from theano import tensor as TT, function
from theano.tensor.nnet import conv2d
from theano.tensor.signal.pool import pool_2d
from theano.sandbox.rng_mrg import MRG_RandomStreams as RandomStreams
from theano.tensor.shared_randomstreams import RandomStreams as SRS
from theano.misc.pkl_utils import dump, load
import lasagne
import lasagne.layers as L
import lasagne.theano_extensions.padding
from lasagne.layers import (InputLayer,  # the input
                            DenseLayer)
from lasagne.layers import *
from lasagne import init, nonlinearities as NL
import theano_helpers  # not Theano: a module of the user's
s = "é"; import theano.tensor as T2
try:
    import lasagne.layers.dnn as dnn
except ImportError:
    pass


def build():
    import theano.tensor as T  # indented
    return T.matrix("x")  # import theano
"""

PORTED = """\
# -*- coding: utf-8 -*-
\"\"\"A program: "import theano" in a docstring stays.\"\"\"
from __future__ import print_function
import os; from synkhronos import theano  # two modules, one line
from synkhronos.theano import tensor as T
from synkhronos.theano.tensor import nnet as nnet
from synkhronos import theano
from synkhronos import theano
from synkhronos.theano import tensor as TT, function
from synkhronos.theano.tensor.nnet import conv2d
from synkhronos.theano.tensor.signal.pool import pool_2d
from synkhronos.theano.sandbox.rng_mrg import MRG_RandomStreams as RandomStreams
from synkhronos.theano.tensor.shared_randomstreams import RandomStreams as SRS
from synkhronos.theano.misc.pkl_utils import dump, load
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne.layers import (InputLayer,  # the input
                            DenseLayer)
from synkhronos.extensions.lasagne.layers import *
from synkhronos.extensions.lasagne import init, nonlinearities as NL
import theano_helpers  # not Theano: a module of the user's
s = "é"; from synkhronos.theano import tensor as T2
try:
    from synkhronos.extensions.lasagne.layers import dnn as dnn
except ImportError:
    pass


def build():
    from synkhronos.theano import tensor as T  # indented
    return T.matrix("x")  # import theano
"""


def test_every_import_form_is_rewritten_and_nothing_else():
    assert port_source(ORIGINAL) == PORTED


def test_windows_line_ends_form_feeds_and_a_line_continuation_survive():
    original = "\x0c\nimport numpy as np\r\nimport theano.tensor \\\r\n    as T\r\nx = 1\r\n"
    assert port_source(original) == (
        "\x0c\nimport numpy as np\r\nfrom synkhronos.theano import tensor as T\r\nx = 1\r\n"
    )


def test_importing_a_package_of_the_port_loads_all_its_modules():
    # "import theano.X.Y" becomes "from synkhronos import theano": X.Y must come with it
    code = (
        "import pkgutil, sys\n"
        "from synkhronos import theano\n"
        "from synkhronos.extensions import lasagne\n"
        "for package in (theano, lasagne):\n"
        "    for module in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        assert module.name in sys.modules, module.name\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600)


def test_porting_twice_changes_nothing_more():
    assert port_source(PORTED) == PORTED


def test_the_ported_forms_provide_every_name():
    assert find_gaps(ORIGINAL) == []


def test_check_reports_what_the_port_lacks_with_its_line():
    program = (
        "import theano\n"
        "import theano.tensor as T\n"
        "from theano.tensor.nnet import conv2d, no_such_op\n"
        "import theano.sandbox.cuda\n"
        "from lasagne.layers import DenseLayer, NoSuchLayer\n"
        "import lasagne.layers as L\n"
        "y = T.nnet.no_such_activation(T.matrix())\n"
        "device = theano.config.device\n"
        "layer, relu = L.DenseLayer, theano.tensor.nnet.relu\n"
        "theano.config.floatX = 'float32'\n"
        "dnn = importlib.import_module('lasagne.layers.dnn')\n"
        "names = ['theano.tensor.nnet', 'lasagne', 'lasagne.layers.get_output', 'a.b']\n"
    )
    assert [str(gap) for gap in find_gaps(program)] == [
        "3: theano.tensor.nnet.no_such_op: synkhronos.theano.tensor.nnet has no no_such_op",
        "4: theano.sandbox.cuda: no such module in the port",
        "5: lasagne.layers.NoSuchLayer: synkhronos.extensions.lasagne.layers has no NoSuchLayer",
        "7: theano.tensor.nnet.no_such_activation: not in the port",
        "8: theano.config.device: not in the port",
        "11: lasagne.layers.dnn: a module's name in a string, not rewritten: "
        "synkhronos.extensions.lasagne.layers.dnn",
        "12: theano.tensor.nnet: a module's name in a string, not rewritten: "
        "synkhronos.theano.tensor.nnet",
    ]


def _port(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "synkhronos", "port", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def test_python_2_gets_a_message_not_a_traceback(tmp_path):
    (tmp_path / "old.py").write_text("import theano\nprint 'loss', 1.0\n")
    run = _port("old.py", cwd=tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stdout + run.stderr
    assert run.stdout.startswith("old.py:2: ")
    assert "a Python 2 program needs converting first" in run.stdout and "futurize" in run.stdout
    assert (tmp_path / "old.py").read_text() == "import theano\nprint 'loss', 1.0\n"


def test_the_command_diffs_checks_and_writes_a_folder(tmp_path):
    folder = tmp_path / "program"
    (folder / "sub").mkdir(parents=True)
    (folder / "main.py").write_text("import theano.tensor as T\nx = T.nnet.nope\n")
    (folder / "sub" / "plain.py").write_text("import numpy\n")
    diff = _port("program", "--diff", cwd=tmp_path)
    assert diff.returncode == 0
    assert "-import theano.tensor as T\n+from synkhronos.theano import tensor as T\n" in diff.stdout
    check = _port("program", "--check", cwd=tmp_path)
    assert check.returncode == 1
    assert (
        check.stdout
        == f"{Path('program', 'main.py')}:2: theano.tensor.nnet.nope: not in the port\n"
    )
    assert (folder / "main.py").read_text().startswith("import theano")  # --diff, --check: no write
    written = _port("program", cwd=tmp_path)
    assert written.returncode == 0 and written.stdout == f"ported {Path('program', 'main.py')}\n"
    assert (folder / "main.py").read_text() == (
        "from synkhronos.theano import tensor as T\nx = T.nnet.nope\n"
    )
    assert (folder / "sub" / "plain.py").read_text() == "import numpy\n"


def test_several_files_and_folders_are_ported_alike(tmp_path):
    """Files and folders in one command, as ``2to3`` takes them: each file once, in the
    order given (a folder's sorted), named in each line about it."""
    project = tmp_path / "project"
    (project / "nested").mkdir(parents=True)
    (project / ".hidden").mkdir()
    files = {
        "alone.py": "import theano\n",
        "project/one.py": "import theano.tensor as T\nx = T.nnet.nope\n",
        "project/two.py": "from lasagne.layers import DenseLayer\n",
        "project/nested/three.py": "import lasagne\nlasagne.layers.NoSuchLayer\n",
        "project/nested/plain.py": "import numpy\n",
        "project/.hidden/skipped.py": "import theano\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    given = ("alone.py", "project", "alone.py", "project/nested")  # repeats: once each

    missing = _port("alone.py", "nowhere", cwd=tmp_path)
    assert missing.returncode == 2 and "nowhere: no such file or folder" in missing.stderr
    check = _port(*given, "--check", cwd=tmp_path)
    assert check.returncode == 1
    assert check.stdout == (
        f"{Path('project', 'nested', 'three.py')}:2: lasagne.layers.NoSuchLayer: not in the port\n"
        f"{Path('project', 'one.py')}:2: theano.tensor.nnet.nope: not in the port\n"
    )
    diff = _port(*given, "--diff", cwd=tmp_path)
    headers = [line[4:].strip() for line in diff.stdout.splitlines() if line.startswith("+++ ")]
    changed = ["alone.py", "project/nested/three.py", "project/one.py", "project/two.py"]
    assert diff.returncode == 0 and headers == [str(Path(name)) for name in changed]
    assert all((tmp_path / name).read_text() == text for name, text in files.items())

    written = _port(*given, cwd=tmp_path)
    assert written.returncode == 0
    assert written.stdout == "".join(f"ported {Path(name)}\n" for name in changed)
    assert (tmp_path / "alone.py").read_text() == "from synkhronos import theano\n"
    assert (project / "two.py").read_text() == (
        "from synkhronos.extensions.lasagne.layers import DenseLayer\n"
    )
    assert (
        (project / "nested" / "three.py")
        .read_text()
        .startswith("from synkhronos.extensions import lasagne\n")
    )
    for name in ("project/nested/plain.py", "project/.hidden/skipped.py"):
        assert (tmp_path / name).read_text() == files[name]
    again = _port(*given, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == ""


# A Lasagne program in the forms above; it checks its own results against numpy.
PROGRAM = """\
import numpy as np
import theano
import theano.tensor as T
from theano.sandbox.rng_mrg import MRG_RandomStreams
import lasagne
from lasagne.layers import InputLayer, DenseLayer
from lasagne.nonlinearities import rectify
from lasagne.init import *

np.random.seed(3)
x = T.matrix("x")
net = DenseLayer(InputLayer((None, 4), x), 3, W=GlorotUniform(), nonlinearity=rectify)
out = lasagne.layers.get_output(net)
noise = MRG_RandomStreams(seed=1).uniform((2,))
f = theano.function([x], [out, noise])
xv = np.random.rand(5, 4).astype(theano.config.floatX)
got, drawn = f(xv)
w, b = (p.get_value() for p in lasagne.layers.get_all_params(net))
np.testing.assert_allclose(got, np.maximum(xv @ w + b, 0), rtol=1e-5)
assert drawn.shape == (2,) and ((drawn >= 0) & (drawn < 1)).all()
print("ran", float(w.sum()))
"""


def test_a_ported_program_runs(tmp_path):
    (tmp_path / "program.py").write_text(PROGRAM)
    assert _port("program.py", "--check", cwd=tmp_path).stdout == ""
    assert _port("program.py", cwd=tmp_path).returncode == 0
    run = subprocess.run(
        [sys.executable, "program.py"], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ran ")


ORIGINALS = os.environ.get("SYNK_PORT_ORIGINALS")  # checkouts of the programs to port


@pytest.mark.skipif(not ORIGINALS, reason="SYNK_PORT_ORIGINALS names no local checkouts")
def test_check_finds_nothing_in_the_local_originals():
    run = _port(str(ORIGINALS), "--check", cwd=Path.cwd())
    assert run.stdout == "", run.stdout
