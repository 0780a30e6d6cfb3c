"""Extensions built on the core: optimizers (``updates``), a one-call training step
(``train``), Lasagne-style layers (``layers``) and the convolution op (``conv``)."""
