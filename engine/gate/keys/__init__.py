"""Attribute keys inferred from memory text, and the sibling check that guards replacement.

A memory is about a *subject* (Maya, the customer's manager, the staging database) and one of its
*attributes* (home city, plan, phone), sometimes narrowed by a *qualifier* (billing vs shipping
address, return vs outbound flight). Two texts about look-alike siblings share most of their words,
so neither the embedder nor the NLI model can be trusted to keep them apart; :func:`relate` does it
with plain text analysis:

* ``key_conflict``: the texts are about different subjects (two named people, the customer vs the
  customer's manager, one child vs another) or carry contrasting qualifiers from one family
  (:data:`FAMILIES`), or the new text announces another instance ("a second office"). A conflict
  forbids replacing the old memory with the new one, so every cue here is chosen to be precise.
* ``key_match``: same subject (as far as the text tells) and same canonical attribute, no conflict:
  an update of that attribute is plausible.
* neither, when the text does not tell.

Explicit keys given by API clients always win: equal keys match, different keys conflict.

A package in three parts: the word tables (:mod:`.vocab`), the parser that reads them
(:mod:`.parse`), and the comparison of two analyses (:mod:`.compare`). Pure: ``re`` and
tables, no I/O.
"""

from engine.gate.keys.compare import Relation, compare_keys
from engine.gate.keys.parse import AttributeKey, infer_key
from engine.gate.keys.vocab import FAMILIES, Family

__all__ = ["FAMILIES", "AttributeKey", "Family", "Relation", "compare_keys", "infer_key"]
