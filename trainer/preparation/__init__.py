"""The trainer's preparation part: what `python -m trainer.prepare` runs to write a prepared dataset.

The training core reads only what it writes, `metadata.json` and the TFRecord shards
(docs/contracts.md#a-prepared-dataset-python--m-trainerprepare-output): an adopter bringing their
own data replaces this folder and `trainer/prepare.py` (docs/architecture.md#the-trainers-parts).
Nothing is imported here, so `trainer.preparation.sourcecheck` stays free of TensorFlow.
"""
