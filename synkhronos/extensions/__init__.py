"""Extensions built on the core: Synkhronos' two-phase optimizers (``updates``), training
steps (``train``), asynchronous and elastic training (``asynchronous``: EASGD, Downpour,
gossip SGD) and the Lasagne port
(``lasagne``). The Ops they share with :mod:`synkhronos.theano` are in :mod:`synkhronos.ops`."""
