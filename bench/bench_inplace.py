"""PyTensor's rewriting of a training step, with its own in-place pass and with
:class:`synkhronos.rank.inplace_rewrite.FastInplaceElemwise`, side by side.

For each model of ``bench/first_step.py`` (momentum, float32), the step's graph is
rewritten twice in this process, in mode CVM, from the same graph: with the fast pass in
place of PyTensor's (what ``synk.function`` does), then with PyTensor's own. Printed:
nodes before and after, seconds of each whole rewriting, their ratio, and whether the two
rewritten graphs are the same (ops, in-place maps, order).

Run: ``python bench/bench_inplace.py`` (ResNet-50), or e.g.
``python bench/bench_inplace.py --models unet lstm``.
"""

from __future__ import annotations

import argparse
import time

import pytensor
from first_step import MODELS, build
from pytensor.compile.maker import FunctionMaker
from pytensor.compile.mode import get_mode
from pytensor.compile.rebuild import construct_function_ins_and_outs
from pytensor.graph.basic import equal_computations

from synkhronos.extensions.lasagne import updates
from synkhronos.rank.inplace_rewrite import with_fast_inplace


def rewrite(mode, ins, outs) -> tuple[float, int, object]:
    """Seconds to rewrite a fresh copy of the graph in ``mode``, its nodes before, and
    the copy."""
    fgraph, _ = FunctionMaker.create_fgraph(ins, outs, force_clone=True)
    before = len(fgraph.apply_nodes)
    start = time.perf_counter()
    mode.optimizer.rewrite(fgraph)
    return time.perf_counter() - start, before, fgraph


def same(a, b) -> bool:
    def nodes(fgraph):
        return [(str(n.op), n.op.destroy_map) for n in fgraph.toposort()]

    return equal_computations(a.outputs, b.outputs, a.inputs, b.inputs) and nodes(a) == nodes(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["resnet50"])
    args = parser.parse_args()
    pytensor.config.floatX = "float32"
    print(f"{'model':9} {'nodes':>6} {'after':>6} {'fast s':>7} {'PyTensor s':>10} "
          f"{'fast/PyTensor':>13} same", flush=True)  # fmt: skip
    for model in args.models:
        inputs, loss, params, _ = build(model)
        steps = updates.momentum(loss, params, learning_rate=0.01, momentum=0.9)
        ins, outs = construct_function_ins_and_outs(inputs, [loss], updates=steps)
        outs = [FunctionMaker.wrap_out(o) for o in outs]
        fast_s, before, fast = rewrite(with_fast_inplace(get_mode("CVM")), ins, outs)
        own_s, _, own = rewrite(get_mode("CVM"), ins, outs)
        print(
            f"{model:9} {before:6d} {len(own.apply_nodes):6d} {fast_s:7.1f} {own_s:10.1f} "
            f"{fast_s / own_s:13.2f} {same(fast, own)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
