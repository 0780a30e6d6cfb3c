"""How a fused step's XLA program reduces its gradient and treats the buffers it updates:
:data:`BUCKET_VAR` and :data:`DONATE_VAR`, read by every GPU rank as it joins
(:meth:`XlaCommunicator.start <synkhronos.transport.comm.xla.XlaCommunicator.start>`).

**Buckets.** A training step's flat gradient, all-reduced inside a fused program
(:mod:`synkhronos.rank.fused_chain`), is reduced in pieces of :data:`BUCKET_VAR` megabytes
(:func:`~synkhronos.transport.comm.traced.reduce_buckets_traced`): each piece's
all-reduce waits only for the gradients it holds, so XLA can run it while the rest of the
backward pass computes. The program is compiled so that XLA keeps the pieces apart
(:meth:`XlaCommunicator.program <synkhronos.transport.comm.xla.XlaCommunicator.program>`).
Every rank gets the same sums either way; with 2 ranks they are bit for bit those of one
all-reduce of the whole vector (each element is ``a + b``), while with more an
all-reduce's order of additions can depend on the vector's length (NCCL's rings cut it
into chunks), so the last bits of a sum may differ from the unbucketed one's.
"""

from __future__ import annotations

import os

BUCKET_VAR = "SYNK_BUCKET_MB"
"""Megabytes per bucket of a fused step's gradient all-reduce (read by every rank as it
joins; default :data:`BUCKET_MB` on GPUs, 0 on CPU devices); "0" all-reduces the whole
vector at once."""

BUCKET_MB = 25.0
"""The default bucket on GPUs: ResNet-50's 102 MB float32 gradient goes in 5 all-reduces.
On CPU devices buckets are off by default: there gloo's all-reduce runs on the rank's
own cores, which the backward pass needs too, and a step took 1.14-1.25x as long with 25 MB
buckets (bench/RESULTS.md)."""

DONATE_VAR = "SYNK_DONATE"
"""Whether a fused chain's program gives the old buffers of the shared variables it
updates to their new values ("1": updated in place, the old arrays deleted) or writes the
new values into buffers of their own ("0"); read by every rank as it joins. Unset: "1" on
GPUs, where donating saves a second copy of the parameters and optimizer state; on CPU
devices each program decides (:func:`synkhronos.rank.fused_chain.reads_overwritten`): it
donates unless an update reads the old value of another variable it updates, as
Lasagne's momentum computes the new parameter from the old velocity, where XLA would
copy that variable and the update phase could not overlap the backward pass
(bench/RESULTS.md)."""


def bucket_bytes_from_env(platform: str = "gpu") -> int:
    """:data:`BUCKET_VAR` in bytes; where unset, :data:`BUCKET_MB` on GPUs and 0 on CPU
    devices (``platform`` "cpu").

    Raises
    ------
    ValueError
        If the variable is not a number of megabytes, at least 0.
    """
    text = os.environ.get(BUCKET_VAR, "").strip()
    megabytes = float(text) if text else (0.0 if platform == "cpu" else BUCKET_MB)
    if not megabytes >= 0:
        raise ValueError(f"{BUCKET_VAR}={text!r}: a number of megabytes, at least 0")
    return int(megabytes * 1e6)


def donate_from_env(platform: str = "gpu") -> bool | None:
    """:data:`DONATE_VAR`; where unset, True on GPUs and None (each program decides) on
    CPU devices (``platform`` "cpu").

    Raises
    ------
    ValueError
        If the variable is not "0" or "1".
    """
    text = os.environ.get(DONATE_VAR, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{DONATE_VAR}={text!r}: 1 (donate) or 0")
    if text:
        return text == "1"
    return None if platform == "cpu" else True


__all__ = ["BUCKET_MB", "BUCKET_VAR", "DONATE_VAR", "bucket_bytes_from_env", "donate_from_env"]
