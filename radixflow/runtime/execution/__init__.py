"""Model execution: loading the model, its layers and attention backends, forward passes and CUDA graphs."""
