"""KFP components, spec builders and validators. Imports kfp, GCPC and Google Cloud clients;
never TensorFlow. Importing the package itself is cheap: each step is its own module."""
