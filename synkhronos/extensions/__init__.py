"""Extensions built on the core: Synkhronos' two-phase optimizers (``updates``), training
steps (``train``), asynchronous and elastic training (``asynchronous``: EASGD, Downpour,
gossip SGD), the Lasagne port (``lasagne``) and the convolution op (``conv``)."""
