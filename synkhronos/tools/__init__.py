"""The command-line tools, run by ``python -m synkhronos``: ``check`` and ``sweep``
(:mod:`~synkhronos.tools.machine_check`), ``timeline``
(:mod:`~synkhronos.tools.timeline_report`) and ``port`` (:mod:`~synkhronos.tools.porting`)."""
