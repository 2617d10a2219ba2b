"""What is benchmarked: corpora, SentencePiece vocabularies, seqio tasks, suite specs."""
