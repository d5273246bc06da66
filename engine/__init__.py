"""memgate: a write gate for AI memory.

Layers, one direction of dependency::

    engine.server (gRPC) -> engine.gate (pipeline) -> engine.runtime / engine.index / engine.store

Pure modules (``errors``, ``types``, ``gate.policy``, ``gate.names``,
``gate.overlap``) import nothing that does I/O.
"""

__version__ = "0.1.0"
