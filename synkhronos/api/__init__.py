"""Rank 0, the user's API: what a call, a collective or a chain checks and plans before
anything is sent. :mod:`synkhronos` exports the public names."""
