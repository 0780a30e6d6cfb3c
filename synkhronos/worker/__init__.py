"""The workers only: the loop each worker process runs (:mod:`synkhronos.worker.loop`).

``python -m synkhronos.worker`` starts it; rank 0 never imports this package.
"""
