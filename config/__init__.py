"""The run config (`RunSpec`, a RUN.toml) that the coordinator, the workers and the cli share.

It lives on neither side: the coordinator validates and serves it, workers build their model
and data from it, and the cli writes and reads it.
"""
