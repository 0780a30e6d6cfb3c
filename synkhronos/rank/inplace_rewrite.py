"""PyTensor's in-place pass for elemwise ops, with the same decisions at a fraction of
the cost on a large graph.

PyTensor's pass (``inplace_elemwise``) tries each elemwise node's inputs as the place of
its output, and asks the graph's validator after every try; the validator orders the whole
graph again (every destructive op's readers must run before it) and looks for a cycle.
For ResNet-50's training step that is about 1,700 tries on a graph of 1,800 nodes, more
than half of them refused: most of a minute. :class:`FastInplaceElemwise` runs PyTensor's
own pass and answers its tries itself where the answer is certain:

- **yes** without the validator when every other reader of the overwritten value comes
  before the node in an order of the graph that respects every ordering so far (the order
  stays valid, so there is no cycle), and none of the checks that the validator makes
  apart from cycles (a constant, a value already overwritten, an input that is also read
  by the node through a view) could refuse it;
- **no** without the validator when one of those readers depends on the node's own
  outputs (a cycle, whatever the other orderings);
- otherwise it asks the validator, as PyTensor does.

So each try gets the answer the validator would give, and the rewritten graph is the one
PyTensor's pass makes. The whole graph is validated once at the end all the same; should
that ever fail, the pass is undone and PyTensor's own runs instead.
"""

from __future__ import annotations

import logging
import math

from pytensor.compile.aliasing import Supervisor
from pytensor.compile.mode import Mode, optdb
from pytensor.graph.basic import Apply, Constant
from pytensor.graph.destroyhandler import DestroyHandler
from pytensor.graph.features import Feature, ReplaceValidate
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.utils import InconsistencyError
from pytensor.tensor.rewriting.elemwise import InplaceElemwiseOptimizer

logger = logging.getLogger(__name__)

PYTENSOR_PASS = "inplace_elemwise"
"""The name of PyTensor's pass in its rewrite database."""

TAG = "synk_fast_inplace_elemwise"
"""The tag (and name) that :func:`with_fast_inplace` includes in a mode."""


_KNOWN_VALIDATORS = (DestroyHandler, Supervisor, ReplaceValidate)
"""The graph features whose vetoes :class:`_Tries` knows: cycles, overwritten constants,
inputs and outputs, values overwritten twice, reintroduced nodes (never, here: a try
always makes a new node)."""


def _vetoes(feature) -> bool:
    """Whether ``feature`` can refuse a change to a graph (it defines ``on_validate``)."""
    return type(feature).on_validate is not Feature.on_validate


class _Tries:
    """Answers the tries of PyTensor's in-place pass on one graph (see the module
    docstring); stands in for the graph's ``replace_all_validate`` during the pass."""

    def __init__(self, fgraph: FunctionGraph, validated):
        self.fgraph = fgraph
        self.validated = validated  # the graph's own replace_all_validate
        self.position: dict[Apply, int] = {}
        self.reorder()
        self.counts = {"accepted": 0, "refused": 0, "asked": 0}
        supervisors = [f for f in fgraph._features if isinstance(f, Supervisor)]
        self.protected = {var for f in supervisors for var in f.protected}
        # The answers know the vetoes of these features only; another asks every time.
        self.known = all(
            isinstance(f, _KNOWN_VALIDATORS) or not _vetoes(f) for f in fgraph._features
        )

    def reorder(self) -> None:
        """Positions of the nodes in an order that respects the graph's orderings."""
        self.position = {node: k for k, node in enumerate(self.fgraph.toposort())}

    def __call__(self, replacements, reason=None, **kwargs):
        old = replacements[0][0].owner
        new = replacements[0][1].owner
        answer = self.answer(old, new)
        if answer is None:
            self.counts["asked"] += 1
            result = self.validated(replacements, reason=reason, **kwargs)
            self.reorder()
            return result
        if not answer:
            self.counts["refused"] += 1
            raise InconsistencyError("a reader of the overwritten value depends on it")
        self.counts["accepted"] += 1
        self.fgraph.replace_all(replacements, reason=reason, **kwargs)
        self.position[new] = self.position.pop(old)
        return None

    def answer(self, old: Apply, new: Apply) -> bool | None:
        """True or False where the validator's answer to ``new`` in place of ``old`` is
        certain, None where the validator must be asked."""
        if old.inputs != new.inputs or len(old.outputs) != len(new.outputs):
            return None
        here = self.position.get(old)
        if not self.known or here is None or any(new.op.view_map.values()):
            return None
        readers = set()
        for index in {i for indices in new.op.destroy_map.values() for i in indices}:
            found = self._readers(new, old, index)
            if found is None:
                return None
            readers |= found
        later = [reader for reader in readers if self.position[reader] > here]
        if not later:
            return True
        return False if self._reaches(old, later) else None

    def _readers(self, new: Apply, old: Apply, index: int) -> set[Apply] | None:
        """The nodes other than ``old`` that read the value that ``new`` overwrites in
        its input ``index`` (through any view of it); None where the validator could
        refuse for another reason than a cycle, or a reader is not a node of the order."""
        views = self.fgraph.destroy_handler
        root = new.inputs[index]
        while root in views.view_i:
            root = views.view_i[root]
        if isinstance(root, Constant) or getattr(root.tag, "indestructible", False):
            return None
        aliases, stack = set(), [root]
        while stack:
            var = stack.pop()
            aliases.add(var)
            stack.extend(views.view_o.get(var, ()))
        if not aliases.isdisjoint(self.protected) or not aliases.isdisjoint(self.fgraph.outputs):
            return None  # the supervisor's to refuse
        if any(var in aliases for k, var in enumerate(new.inputs) if k != index):
            return None  # read twice by the node itself: the validator decides
        readers = set()
        for var in aliases:
            for client, position in self.fgraph.clients[var]:
                if client is old:
                    continue
                if client not in self.position or any(
                    position in indices for indices in client.op.destroy_map.values()
                ):
                    return None  # an output, or overwritten already
                readers.add(client)
        return readers

    def _reaches(self, node: Apply, targets: list[Apply]) -> bool:
        """Whether a path of the graph leads from ``node``'s outputs to one of
        ``targets``; only nodes up to the latest target's position can be on one."""
        targets_set = set(targets)
        last = max(self.position[t] for t in targets)
        seen: set[Apply] = set()
        stack = [node]
        while stack:
            current = stack.pop()
            for out in current.outputs:
                for client, _ in self.fgraph.clients[out]:
                    if client in targets_set:
                        return True
                    at = self.position.get(client)
                    if at is not None and at <= last and client not in seen:
                        seen.add(client)
                        stack.append(client)
        return False


class FastInplaceElemwise(InplaceElemwiseOptimizer):
    """PyTensor's in-place pass for elemwise ops with most of its validation answered
    without ordering the whole graph (see the module docstring)."""

    def add_requirements(self, fgraph):
        """PyTensor's pass's features, and the graph's history (to undo the pass)."""
        super().add_requirements(fgraph)
        if not hasattr(fgraph, "checkpoint"):
            fgraph.attach_feature(ReplaceValidate())

    def apply(self, fgraph):
        """PyTensor's pass over ``fgraph``, its tries answered as the module docstring
        says, then the whole graph validated once; its profile, as PyTensor's."""
        start = fgraph.checkpoint()
        tries = _Tries(fgraph, fgraph.replace_all_validate)
        fgraph.replace_all_validate = tries
        try:
            profile = super().apply(fgraph)
        finally:
            del fgraph.replace_all_validate
        try:
            fgraph.validate()
        except InconsistencyError as error:
            logger.warning(
                "synkhronos: the fast in-place pass left an inconsistent graph (%s); "
                "running PyTensor's own instead",
                error,
            )
            fgraph.revert(start)
            return super().apply(fgraph)
        logger.debug("synkhronos: in-place tries %s", tries.counts)
        return profile


# Just before PyTensor's pass, whose place it takes: after every pass before it, and
# before those that share its position (ties run in the order of their names).
optdb.register(
    TAG,
    FastInplaceElemwise(),
    position=math.nextafter(optdb.__position__[PYTENSOR_PASS], -math.inf),
)


def with_fast_inplace(mode: Mode) -> Mode:
    """``mode`` with :class:`FastInplaceElemwise` in place of PyTensor's in-place pass
    for elemwise ops (the same rewritten graph, sooner); ``mode`` itself if it has no
    such pass."""
    # The query's passes (a list; PyTensor 3.3 wraps it in a rewriter that hands on ``data``).
    passes = getattr(mode.optimizer, "data", ())
    if not any(getattr(r, "name", None) == PYTENSOR_PASS for r in passes):
        return mode
    return mode.excluding(PYTENSOR_PASS).including(TAG)
