"""Model settings the model tests share (imported by name: pytest puts this folder on the path)."""

# One encoder and one decoder layer (the `tiny` preset has two each), for tests that need no depth: the same code
# paths, compiled sooner (a tiny PaDIR train step: 10,150 -> 6,476 lines of HLO). Tests that must learn a toy task,
# and those that map layers (warm-start copying, ONNX and CTranslate2 exports), keep two. The smoke suite's spec
# says the same in its [model.overrides]; the benchmarks, run untimed in the test suite, use it too.
ONE_LAYER = dict(num_encoder_layers=1, num_decoder_layers=1)
