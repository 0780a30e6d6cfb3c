"""Lasagne's ``lasagne.theano_extensions``: 1-D convolutions (:mod:`.conv`) and constant
padding (:mod:`.padding`) as graph functions."""
