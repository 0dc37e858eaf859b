"""Backpropagation through long windows in bounded memory: paging, core checkpointing, schedules, the segment store."""
