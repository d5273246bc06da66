"""Drop-in stricter writes for agent-memory frameworks.

- :mod:`engine.adapters.langgraph`: ``GatedStore``, a LangGraph ``BaseStore`` (and so LangMem's
  store) whose puts go through the gate. Extra: ``pip install 'memgate[langgraph]'``.
- :mod:`engine.adapters.mem0`: ``GatedMemory``, a facade over a ``mem0.Memory`` whose ``add``
  goes through the gate. Extra: ``pip install 'memgate[mem0]'``.
- :mod:`engine.adapters.graphiti`: ``GatedLLMClient``, a Graphiti ``LLMClient`` wrapper that
  re-checks the contradictions of Graphiti's edge resolution with the gate before Graphiti
  invalidates them. Extra: ``pip install 'memgate[graphiti]'``. It judges in-process only.

LangGraph and Mem0 talk to memgate through :class:`engine.adapters._engine.GateEngine`: an
in-process engine or a ``MemgateClient`` for a remote ``memgate serve``. Importing this package
imports no framework.
"""

from engine.adapters._engine import GateEngine, LocalEngine, RemoteEngine, as_gate_engine

__all__ = ["GateEngine", "LocalEngine", "RemoteEngine", "as_gate_engine"]
