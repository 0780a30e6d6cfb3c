"""Corrections to PyTensor's JAX backend that synkhronos relies on.

Imported on every rank before a function is compiled in JAX mode.

* ``ARange``: PyTensor hands ``jnp.arange`` its constant bounds with their own small
  dtypes (the 0 of ``pt.arange(n)`` is int8), which overflow once the stop passes 127, so
  e.g. ``p[pt.arange(y.shape[0]), y]`` failed for 128 rows or more. Constant bounds are
  given as Python numbers here. PyTensor refused any other bound, though one computed
  from shapes is concrete when JAX traces: the gradient of a diagonal whose size is the
  batch's (``pt.diag(z1 @ z2.T)``, a CLIP-style loss) takes an arange as long as the
  smaller of two shapes. Here a bound is refused only where it is not concrete.
* A fused scalar expression (``Composite``) of scalars runs through ``jnp.vectorize``,
  which makes even a concrete value a traced one: a pooling layer's output length,
  ``(h - 2) // 2 + 1`` of an input's shape, fused, was then no shape that JAX accepts
  for a dropout mask's size ("Shapes must be 1D sequences of concrete values"). The
  outputs that depend on concrete numbers only (which, in a traced function, come from
  shapes and constants) are computed by PyTensor's own scalar code (``impl``), and stay
  concrete, beside the others (a diagonal's length fused with the loss's mean); so does
  a concrete scalar taken from a tensor (``ScalarFromTensor``: a slice's bound).
* ``AdvancedIncSubtensor1`` (``inc_subtensor(W[idx], y)``: an embedding's gradient; PyTensor
  3.0's op: 3.3 has none, and its ``AdvancedIncSubtensor`` does not refuse the row)
  refused, as "runtime broadcasting", a ``y`` of one row added into a ``W`` of more: its
  check compares ``y``'s leading axis with ``W``'s, though that axis is the index's, so a
  rank given one row failed (PyTensor's Python linker too; its C and Numba code do not
  refuse). Here ``y`` is checked against the shape it is added into, ``W[idx]``'s: a
  length-1 axis not declared broadcastable is still refused where the other is longer.
* JAX 0.12 stages every operation inside ``jax.jit``, on concrete numbers too: an
  elementwise op of a shape's lengths (``eq(6, 6)`` checking a dropout mask's length)
  made a traced length, no shape JAX accepts for ``alloc``. An ``Elemwise`` whose inputs
  are all concrete scalars is computed by PyTensor's scalar code (``impl``), as above.
* With floatX float32, JAX runs without 64-bit types on purpose; its warnings that int64
  indices are truncated to int32 say nothing the user can act on, so they are silenced.
* PyTensor warns, at every compile, that it drops its broadcasting checks when tracing
  for JAX. JAX still rejects incompatible shapes; what is lost is only PyTensor's refusal
  to broadcast a length-1 axis not declared broadcastable (docs/limitations.rst says so),
  so the warnings, one per compile, are silenced.
* PyTensor's JAX linker keeps, in the globals of the Python function it generates for a
  graph, a device copy of every shared variable's value at compile time, under the name
  of that function's parameter for the same variable, which shadows it: never read, and
  on a GPU a second copy of the parameters and optimizer state for each compiled
  function (issue 51). :func:`drop_compile_time_copies` drops them.
* PyTensor's JAX linker gives each compiled function its own copy of every random
  generator it reads (a JAX key made from the generator's state at compile time): the
  function draws from, and advances, its copy, which the shared variable never sees,
  while synkhronos writes a training function's next states into the shared variables
  (every rank keeps rank 0's, :mod:`synkhronos.api.split`). :func:`share_generators`
  makes the function read and write the shared variables' own storage, in the form the
  compiled function takes (a JAX key). A function compiled later copies that key: the
  linker's ``pytensor.shared`` of it makes a random generator variable again (it made
  an untyped one, which the linker then refused).
* A program's own ``pytensor.function`` on rank 0 of GPU ranks compiles in JAX mode
  (rank 0's shared variables hold JAX arrays; :mod:`synkhronos.rank.backends.gpu`), but
  returns what the user asked of PyTensor's default mode: NumPy arrays
  (:data:`HOST_OUTPUTS_JAX`; a JAX array is no dictionary key, and ``np.argmax`` of one
  is a JAX array). Its updates stay JAX arrays, where the shared variables hold them.
* A compiled function takes every input of its graph, also those it does not read (a
  variable its updates write, as a training function's round writes the rows it keeps
  for the next), and ``jax.jit`` compiles anew for each new shape of any argument: the
  rounds of a training function on GPU ranks each compiled twice, at the first call
  (the variables held their empty start values) and at the second (they held the first
  call's rows), issue 62. Each tensor input the graph does not read is given to JAX as
  an empty array of its dtype and dimensions: the program depends on what it reads.
* XLA's compiled programs are kept on disk (JAX's persistent compilation cache), in
  :data:`JAX_FOLDER` of PyTensor's compile folder unless the user set a folder
  (``JAX_COMPILATION_CACHE_DIR``): a second run of a script, or another rank, loads a
  program instead of compiling it again. Every program is kept, however fast it
  compiled (JAX keeps only those of a second or more unless
  ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` says otherwise): the rounds of a deep
  network's batch statistics are small programs, many of them alike, each compiled
  once and loaded for the others. ``python -m synkhronos sweep --cache`` removes them.
"""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytensor
import pytensor.tensor.subtensor
from pytensor.compile.mode import JAX, Mode
from pytensor.compile.sharedvalue import shared_constructor
from pytensor.graph.basic import Constant
from pytensor.link.jax.dispatch import jax_funcify
from pytensor.link.jax.linker import JAXLinker
from pytensor.scalar.basic import Composite
from pytensor.tensor.basic import ARange, ScalarFromTensor
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.random.type import RandomType, random_generator_type
from pytensor.tensor.random.variable import RandomGeneratorSharedVariable
from pytensor.tensor.type import TensorType

warnings.filterwarnings(
    "ignore", message="Explicitly requested dtype .* is not available", category=UserWarning
)
warnings.filterwarnings(
    "ignore", message="Skipping Assert.*Could not broadcast dimensions", category=UserWarning
)


def match_precision() -> None:
    """Set JAX's 64-bit mode from floatX, as every rank of a session sets it at its start.

    PyTensor's JAX backend sets it from floatX when it is first imported; a worker that ran
    JAX code (a routine's program) before it compiled a JAX-mode function computed in 32
    bits where rank 0 computed in 64."""
    jax.config.update("jax_enable_x64", pytensor.config.floatX == "float64")


JAX_FOLDER = "synkhronos-jax"
"""The folder of XLA's compiled programs, in PyTensor's compile folder."""

if getattr(jax.config, "jax_compilation_cache_dir", None) is None and not os.environ.get(
    "JAX_COMPILATION_CACHE_DIR"
):
    jax.config.update(
        "jax_compilation_cache_dir", str(Path(pytensor.config.compiledir) / JAX_FOLDER)
    )
if (
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ
    and jax.config.jax_persistent_cache_min_compile_time_secs == 1.0  # JAX's default
):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@jax_funcify.register(ARange)
def _jax_arange(op, node, **kwargs):
    constants = [arg.data.item() if isinstance(arg, Constant) else None for arg in node.inputs]

    def arange(start, stop, step):
        bounds = [
            a if c is None else c for a, c in zip((start, stop, step), constants, strict=True)
        ]
        if not all(map(_concrete_scalar, bounds)):
            raise NotImplementedError(
                "JAX needs the bounds of arange to be constants or computed from shapes"
            )
        return jnp.arange(*bounds, dtype=op.dtype)

    return arange


@jax_funcify.register(ScalarFromTensor)
def _jax_scalar_from_tensor(op, node, **kwargs):
    def scalar_from_tensor(x):
        return x if _concrete_scalar(x) else jnp.array(x).flatten()[0]

    return scalar_from_tensor


def _jax_advanced_inc_subtensor1(op, node, **kwargs):
    declared = node.inputs[1].broadcastable

    def inc_subtensor1(x, y, idx):
        target = (idx.shape[0], *x.shape[1:])  # the shape of x[idx], which y is added into
        dims = zip(reversed(declared), reversed(y.shape), reversed(target), strict=False)
        if any(not b and n == 1 and n != m for b, n, m in dims):
            raise ValueError(op._runtime_broadcast_error_msg)
        at = x.at[idx]
        return at.set(y) if op.set_instead_of_inc else at.add(y)

    return inc_subtensor1


# PyTensor 3.3 has no AdvancedIncSubtensor1: its AdvancedIncSubtensor does that work.
_INC_SUBTENSOR1 = getattr(pytensor.tensor.subtensor, "AdvancedIncSubtensor1", None)
if _INC_SUBTENSOR1 is not None:
    jax_funcify.register(_INC_SUBTENSOR1)(_jax_advanced_inc_subtensor1)


_vectorized_composite = jax_funcify.dispatch(Composite)


def _concrete_scalar(value) -> bool:
    """Whether ``value`` is a concrete scalar (a shape's length, a constant), not a traced
    or device value."""
    return isinstance(value, int | float | bool | np.generic | np.ndarray) and np.ndim(value) == 0


def _by_impl(scalar_op, args, n_outputs: int) -> list:
    """The outputs of PyTensor's own scalar code (``impl``) of ``scalar_op`` on the concrete
    numbers ``args``, as a list (``impl`` returns one output bare)."""
    outs = scalar_op.impl(*args)
    return list(outs) if n_outputs > 1 else [outs]


@jax_funcify.register(Composite)
def _jax_composite(op, node=None, **kwargs):
    vectorized = _vectorized_composite(op, node=node, **kwargs)
    order = op.fgraph.toposort()
    single = len(op.fgraph.outputs) == 1

    def composite(*args):
        values = {v: a for v, a in zip(op.fgraph.inputs, args, strict=True) if _concrete_scalar(a)}

        def value(v):
            return v.data if isinstance(v, Constant) else values[v]

        for n in order:  # PyTensor's own scalar code, on the concrete numbers
            if all(isinstance(i, Constant) or i in values for i in n.inputs):
                outs = _by_impl(n.op, [value(i) for i in n.inputs], len(n.outputs))
                values.update(zip(n.outputs, outs, strict=True))
        known = [isinstance(o, Constant) or o in values for o in op.fgraph.outputs]
        if all(known):
            outs = [value(o) for o in op.fgraph.outputs]
        else:  # an output of shapes stays concrete beside those of traced values
            traced = vectorized(*args)
            traced = [traced] if single else list(traced)
            outs = [
                value(o) if k else t
                for o, k, t in zip(op.fgraph.outputs, known, traced, strict=True)
            ]
        return outs[0] if single else tuple(outs)

    return composite


_jax_elemwise = jax_funcify.dispatch(Elemwise)


@jax_funcify.register(Elemwise)
def _jax_elemwise_concrete(op, node=None, **kwargs):
    traced = _jax_elemwise(op, node=node, **kwargs)
    dtypes = [o.type.dtype for o in node.outputs]

    def elemwise(*args):
        if not all(_concrete_scalar(a) for a in args):
            return traced(*args)
        outs = _by_impl(op.scalar_op, args, len(dtypes))
        outs = [np.asarray(o, dtype=d) for o, d in zip(outs, dtypes, strict=True)]
        return outs[0] if len(dtypes) == 1 else tuple(outs)

    return elemwise


def drop_compile_time_copies(fn) -> int:
    """Drop, from the globals of ``fn``'s generated JAX function (a ``pytensor.function``
    in JAX mode), the values named like the function's parameters (see the module
    docstring); returns how many. Other functions are left as they are (0)."""
    jit_fn = getattr(getattr(fn, "vm", None), "jit_fn", None)
    generated = getattr(jit_fn, "__wrapped__", None)
    for cell in getattr(jit_fn, "__closure__", None) or ():  # scalar shape inputs' wrapper
        generated = generated or getattr(cell.cell_contents, "__wrapped__", None)
    code, env = getattr(generated, "__code__", None), getattr(generated, "__globals__", None)
    if code is None or env is None:
        return 0
    names = set(code.co_varnames[: code.co_argcount]) & set(env)
    for name in names:
        del env[name]
    return len(names)


_jit_compile = JAXLinker.jit_compile


def _jit_compile_read_inputs(self, fn):
    """PyTensor's ``jit_compile``, whose function is given, for each tensor input the
    graph does not read, an empty array of its dtype and dimensions (see the module
    docstring); its own where the graph reads every input."""
    jitted = _jit_compile(self, fn)
    fgraph = self.fgraph
    stand_ins = {
        i: np.empty((0,) * v.type.ndim, v.type.dtype)
        for i, v in enumerate(fgraph.inputs)
        if not fgraph.clients[v] and isinstance(v.type, TensorType)
    }
    if not stand_ins:
        return jitted

    def call(*args):
        return jitted(*(stand_ins.get(i, a) for i, a in enumerate(args)))

    call.__wrapped__ = fn  # the generated function
    return call


JAXLinker.jit_compile = _jit_compile_read_inputs  # type: ignore[method-assign]


@shared_constructor.register(dict)
def _generator_key(value, name=None, strict=False, allow_downcast=None, borrow=False, **kwargs):
    """``pytensor.shared`` of a dict: a random generator variable where the dict is a JAX
    key made from a generator (as :func:`share_generators` leaves it), else PyTensor's."""
    if "jax_state" not in value or "bit_generator" not in value:
        return shared_constructor.dispatch(object)(
            value, name=name, strict=strict, allow_downcast=allow_downcast, **kwargs
        )
    # Made with a placeholder generator: the type's check of a key fails on JAX 0.12's
    # arrays (it reads a private attribute they lack).
    var = RandomGeneratorSharedVariable(
        type=random_generator_type,
        value=np.random.default_rng(0),
        strict=False,
        allow_downcast=None,
        name=name,
    )
    var.container.storage[0] = value if borrow else copy.deepcopy(value)
    return var


class JAXHostOutputsLinker(JAXLinker):
    """PyTensor's JAX linker, whose function returns its outputs as NumPy arrays; the
    values of its updates stay JAX arrays."""

    def jit_compile(self, fn):
        jitted = super().jit_compile(fn)
        updates = set(getattr(self.fgraph, "update_mapping", None) or {})
        returned = [i not in updates for i in range(len(self.fgraph.outputs))]

        def call(*args):
            outs = jitted(*args)
            return [np.asarray(o) if r else o for o, r in zip(outs, returned, strict=True)]

        return call


class _HostOutputsMode(Mode):
    """:data:`HOST_OUTPUTS_JAX`'s class: one mode, named the same in every process (a
    compiled graph's stored form is found by its PyTensor settings, this one's name)."""

    def __str__(self) -> str:
        return "JAX, outputs on the host"

    def __reduce__(self):
        return (_host_outputs_mode, ())


def _host_outputs_mode() -> Mode:
    return HOST_OUTPUTS_JAX


HOST_OUTPUTS_JAX = _HostOutputsMode(JAXHostOutputsLinker(), JAX.provided_optimizer)
"""PyTensor's JAX mode, but the functions return NumPy arrays (see the module docstring):
rank 0's ``pytensor.config.mode`` in a GPU session where the program set none."""


def share_generators(fn) -> int:
    """Make ``fn`` (a ``pytensor.function`` in JAX mode) read and write its random
    generators' states in the shared variables' own storage, where PyTensor's JAX linker
    gave it copies (see the module docstring); returns how many. A ``Generator`` value is
    converted to the JAX key the compiled function takes; call before :func:`direct_call`."""
    from pytensor.link.jax.dispatch import jax_typify

    cells = getattr(getattr(fn, "vm", None), "inputs", None)
    if cells is None:
        return 0
    moved = {}
    for inp, container in zip(fn.maker.inputs, fn.input_storage, strict=True):
        var = inp.variable
        own = getattr(var, "container", None)
        if not isinstance(var.type, RandomType) or own is None or own.storage is container.storage:
            continue
        if isinstance(own.storage[0], np.random.Generator):
            own.storage[0] = jax_typify(own.storage[0])
        moved[id(container.storage)] = own.storage
        container.storage = own.storage
    cells[:] = [moved.get(id(cell), cell) for cell in cells]
    fn._input_storage_data = tuple(moved.get(id(c), c) for c in fn._input_storage_data)
    return len(moved)


def direct_call(fn):
    """A callable that runs ``fn`` (a ``pytensor.function`` in JAX mode, its inputs
    trusted) by calling its jitted function at once, with the arguments and the current
    values of the shared variables it reads, as PyTensor's call does through its input
    and output storage (two microseconds of a tiny call, issue 51); None where ``fn``
    is not such a function or PyTensor applies updates after it. A failure is run again
    through ``fn``, whose error names the failing op."""
    vm = getattr(fn, "vm", None)
    jit_fn, cells = getattr(vm, "jit_fn", None), getattr(vm, "inputs", None)
    mine = getattr(fn, "_input_storage_data", None)
    if jit_fn is None or cells is None or mine is None or fn._has_updates or not fn.trust_input:
        return None
    n = len(mine)
    if len(cells) < n or any(c is not s for c, s in zip(cells, mine, strict=False)):
        return None  # not the layout this shortcut knows: the explicit inputs first
    shared = cells[n:]

    def call(*args):
        try:
            return jit_fn(*args, *[c[0] for c in shared]) if shared else jit_fn(*args)
        except Exception:  # noqa: BLE001 - fn raises it again, naming the op
            return fn(*args)

    return call
