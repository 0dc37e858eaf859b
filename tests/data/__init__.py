"""Tests of data/: the byte corpus, diagnostic tasks, typing and git frames, lazy windows."""
