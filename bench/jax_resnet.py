"""ResNet-50 written by hand in JAX, trained data-parallel: the yardstick for synkhronos'
ResNet-50 step on GPU ranks (``gpu_check.py``).

The same network as ``resnet50`` of demos/resnet.py (bias-free convolutions,
batch normalization with batch statistics, stride in the first 1x1 convolution of each
downsampling block, global average pooling, a softmax layer), the same loss (cross-entropy
of the batch mean) and rule (SGD with momentum 0.9). One step is one jitted program over
the mesh: each device computes the gradient of its rows, ``psum`` sums them, and each
applies the update, as a JAX user would write data parallelism without synkhronos.
"""

from __future__ import annotations

import numpy as np

STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))


def _conv(key, n_in: int, n_out: int, size: int):
    import jax

    scale = np.sqrt(2.0 / (n_in * size * size))  # He normal, gain relu
    return jax.random.normal(key, (n_out, n_in, size, size), np.float32) * scale


def init(key, num_classes: int = 1000) -> dict:
    """The parameters, as a nested dict of float32 arrays."""
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(key, 200))

    def conv_bn(n_in, n_out, size):
        return {
            "w": _conv(next(keys), n_in, n_out, size),
            "gamma": jnp.ones(n_out, np.float32),
            "beta": jnp.zeros(n_out, np.float32),
        }

    params = {"conv1": conv_bn(3, 64, 7), "blocks": []}
    n_in = 64
    for stage, (width, blocks) in enumerate(STAGES):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            unit = {
                "a": conv_bn(n_in, width, 1),
                "b": conv_bn(width, width, 3),
                "c": conv_bn(width, 4 * width, 1),
            }
            if stride != 1 or n_in != 4 * width:
                unit["proj"] = conv_bn(n_in, 4 * width, 1)
            params["blocks"].append(unit)
            n_in = 4 * width
    params["fc"] = {
        "w": jax.random.normal(next(keys), (n_in, num_classes), np.float32) * np.sqrt(1.0 / n_in),
        "b": jnp.zeros(num_classes, np.float32),
    }
    return params


def strides() -> list[int]:
    """The stride of each bottleneck block, in order (static: not part of the parameters)."""
    return [
        2 if block == 0 and stage > 0 else 1
        for stage, (_, blocks) in enumerate(STAGES)
        for block in range(blocks)
    ]


def _conv_bn(p, x, stride: int = 1, relu: bool = True):
    import jax
    import jax.numpy as jnp

    size = p["w"].shape[-1]  # odd: "same" padding, as Lasagne's
    x = jax.lax.conv_general_dilated(
        x,
        p["w"],
        (stride, stride),
        [(size // 2, size // 2)] * 2,
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
    )
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    var = x.var(axis=(0, 2, 3), keepdims=True)
    x = (x - mean) * jax.lax.rsqrt(var + 1e-4)
    x = x * p["gamma"][None, :, None, None] + p["beta"][None, :, None, None]
    return jnp.maximum(x, 0) if relu else x


def apply(params: dict, x):
    """Class log-probabilities of the images ``x`` (NCHW)."""
    import jax
    import jax.numpy as jnp

    x = _conv_bn(params["conv1"], x, 2)
    x = jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 2, 2), ((0, 0), (0, 0), (1, 1), (1, 1))
    )
    for unit, stride in zip(params["blocks"], strides(), strict=True):
        branch = _conv_bn(unit["a"], x, stride)
        branch = _conv_bn(unit["b"], branch)
        branch = _conv_bn(unit["c"], branch, relu=False)
        shortcut = _conv_bn(unit["proj"], x, stride, relu=False) if "proj" in unit else x
        x = jnp.maximum(branch + shortcut, 0)
    x = x.mean(axis=(2, 3))
    return jax.nn.log_softmax(x @ params["fc"]["w"] + params["fc"]["b"])


def data_parallel_step(mesh, axis: str, learning_rate: float = 0.01, momentum: float = 0.9):
    """``step(params, velocity, x, y) -> (params, velocity, loss)``: one jitted program over
    ``mesh``, each device on its own rows (global arrays sharded along ``axis``)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    n = mesh.devices.size

    def loss_of(params, x, y):
        return -jnp.take_along_axis(apply(params, x), y[:, None], axis=1).mean()

    def local(params, velocity, x, y):
        loss, grads = jax.value_and_grad(loss_of)(params, x, y)
        grads = jax.lax.psum(grads, axis)
        velocity = jax.tree.map(lambda v, g: momentum * v - learning_rate * g / n, velocity, grads)
        params = jax.tree.map(lambda p, v: p + v, params, velocity)
        return params, velocity, jax.lax.pmean(loss, axis)

    return jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(P(), P(), P(axis), P(axis)),
            out_specs=(P(), P(), P()),
            check_vma=False,
        )
    )
