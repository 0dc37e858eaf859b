"""Tests of train/: streaming BPTT, checkpoint schedules, core checkpointing."""
