"""Theano's Ops on PyTensor, the layer that both :mod:`synkhronos.theano` and the Lasagne
port (:mod:`synkhronos.extensions.lasagne`) build on: the convolution and pooling Ops
(:mod:`~synkhronos.ops.conv`), Theano's ``nnet`` functions (:mod:`~synkhronos.ops.nnet`),
its pooling functions (:mod:`~synkhronos.ops.pool`) and its random streams
(:mod:`~synkhronos.ops.random_streams`). They import no other synkhronos package."""
