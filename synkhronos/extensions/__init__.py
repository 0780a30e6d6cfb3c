"""Extensions built on the core: Synkhronos' two-phase optimizers (``updates``), training
steps (``train``), the Lasagne port (``lasagne``) and the convolution op (``conv``)."""
