"""The conformance tier: the compiled template, rendered for a matrix of option combinations, run
through the real GCPC launchers against fakes of the final RPC
(docs/guarantees.md#conformance-the-real-launchers-every-option)."""
