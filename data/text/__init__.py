"""rcswarm.data.text: byte-level text corpora and batch samplers."""

from rcswarm.data.text.stdlib import ByteWindowSampler, load_stdlib_corpus, split_boundary, stdlib_source_files

__all__ = ["ByteWindowSampler", "load_stdlib_corpus", "split_boundary", "stdlib_source_files"]
