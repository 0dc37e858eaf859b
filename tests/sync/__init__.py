"""Tests of sync/: codecs and error feedback, tensor payloads, the outer step."""
