"""Rank 0's session: starting, watching and stopping the workers, and running one command on
every rank."""
