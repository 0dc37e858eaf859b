"""Tests of protos/: the committed stubs match the .proto, which follows the house rules."""
