"""Offline tuning: scoring labelled cases, evaluating a policy, calibrating its bars, fitting
the judge, and the policy files they write. Nothing here runs on the serving path except
:mod:`engine.tuning.policy_file`'s reader, which ``serve`` and ``triage`` use to apply a
calibrated file."""
