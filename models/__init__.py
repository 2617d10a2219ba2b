"""Flax models and decoders: T5 layers, AR (KV cache, greedy/beam), PaDIR, training, distillation."""
