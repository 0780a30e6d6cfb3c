"""What every rank runs, rank 0 included: its state, its compiled functions, its part of a
call, a collective, a chain or a routine, and the backend it computes on."""
