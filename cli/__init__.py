"""The `rcswarm` command line: entry points on top of the coordinator, the worker and the data.

`main` dispatches; `run` is the local launcher, `status`, `fit`, `bench` and `data` the
other commands. Nothing below this package imports it.
"""
