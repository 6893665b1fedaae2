"""The training application: runs inside the trainer image on Vertex AI and as local processes.

Imports TensorFlow, tf-keras and TensorFlow Datasets, never kfp. Importing this package is
cheap: TensorFlow is imported only by the modules that need it, when they are first used.
"""
