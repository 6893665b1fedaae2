"""The front door: `make run` (local or Vertex), `make schedule`, settings, the run summary and
report. Imports `pipeline` and below; nothing below imports it."""
