"""Build models, engines and the Triton model repository."""
