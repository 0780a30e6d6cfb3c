"""How ranks talk: the named wire protocol, shared-memory segments and mailboxes, the command
channel, the communicators, the MPI world of several nodes, and the row splits and reductions
they share."""
