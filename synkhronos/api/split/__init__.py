"""The split: a training function's graph cut where its rows meet, so that every rank
computes the one-device answer.

``synk.function([x, y], loss, updates=adam(loss, params))`` computes, on one device, the
gradient of the whole batch's loss. Run as it is on N ranks, each rank would apply Adam to
its own copy with its own rows' gradient, and the copies would drift apart. This package
cuts such a function's graph in two, at the variables where the rows are summed away:

- the **row phase** (every rank, on its rows) computes those variables — the *frontier*:
  the gradients ``x.T @ delta``, the loss's ``sum(ce)``, a batch's statistics;
- one all-reduce (op "sum") of all of them, in one collective;
- the **reduced phase** (every rank, the same values) computes the updates and the
  outputs from the reduced frontier: every rank applies the same update to the same
  values, so the ranks stay bit-identical, and equal one device's.

A sum over rows is exact when summed again over the ranks. A *mean* over rows divides by
the row count, which on a rank is its own count: wherever the graph uses a row count as
a value (``mean``'s division, the gradient's ``1 / n``), the row phase uses the call's
whole count instead (a hidden broadcast input), so that every rank's term is its share of
the whole batch's mean. A mean loss, a sum loss, a loss plus a penalty on the parameters
(the penalty is added once, in the reduced phase) are all exact.

A sum over rows that the rows' computation reads back (batch normalization's mean and
variance, and their gradients' sums) needs the whole batch before the rows can go on:
the row phase is then itself cut into *rounds*
(:attr:`~synkhronos.api.split.phases.PhaseSplit.rounds`). Each round computes the
statistics whose inputs are ready, and the ranks sum them (one all-reduce per round);
the next round reads the sums, divided by the whole count where the graph divides. What
a later round reads of an earlier one's rows (a layer's output, the inputs, a dropout
mask) the earlier one keeps, on its rank, so nothing is computed twice. A sum whose
terms share a factor constant over the rows that is itself a statistic (the gradient of
batch normalization's mean, through its variance: ``sum(g * (x - mean))``) is summed
without it and multiplied after (``g * sum(x - mean)``), so that it waits for no round
of its own: batch normalization takes 3 rounds a layer (the mean; the variance; the
gradient's sums).

A maximum or a minimum over rows that the rows read back is a statistic too, all-reduced
with "max" or "min"; one that only the updates or the outputs read crosses to the reduced
phase by a "max" or "min" all-reduce of its own. A softmax or log-softmax over the rows
is rewritten as its maximum and sum over them before the analysis, so that a listwise
loss is exact.

Between the rows and their reductions, every op must be one known to keep the rows apart
(:mod:`~synkhronos.api.split.keeping`: elementwise ops, transposes, reductions over other
axes, a matrix product with one operand of the rows, convolutions over the batch, a scan
along another axis, ...). What cannot be exact this way is said
(:attr:`~synkhronos.api.split.phases.PhaseSplit.inexact`, naming the op and why): a
reduction over rows that is neither a sum, a maximum nor a minimum (``prod``), an op that
mixes rows other than by a reduction (a matrix product of two values of the rows, as
``z1 @ z2.T``; a cumulative op, a sort over the rows; indexing the rows by position, as
``x[1:]``), an op not on the list, statistics that would take more than
:data:`~synkhronos.api.split.phases.MAX_ROUNDS` rounds or that an output the ranks compute
on their own rows reads (then every statistic is each rank's own, and the frontier
averages them, weighted by rows), and random draws per row where no row's position can be
known (no scattered input) or the draw's parameters vary by row (elsewhere every rank
draws the whole batch's numbers and keeps its rows').

The analysis runs on rank 0 when the function is built: PyTensor's shape inference tells
which axes of every variable have the rows' length. Where the reduced phase reads a row
input's lengths (a mean's count over targets whose channels only the targets know), they
cross the all-reduce as each rank's lengths times its rows, divided by the whole count after.

Its modules, lowest first: :mod:`~synkhronos.api.split.walk` (the one graph walk),
:mod:`~synkhronos.api.split.lengths` (which axes have the rows' length),
:mod:`~synkhronos.api.split.analysis` (which values depend on the rows),
:mod:`~synkhronos.api.split.keeping` (which ops keep them apart),
:mod:`~synkhronos.api.split.rounds` (the rounds' plan), :mod:`~synkhronos.api.split.rebuild`
(the phases' graphs), :mod:`~synkhronos.api.split.phases` (the split) and
:mod:`~synkhronos.api.split.stored` (the split kept on disk).
"""
