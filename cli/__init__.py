"""The `rcswarm` command line: entry points on top of the coordinator, the worker, the launcher and the data.

`main` dispatches; `run` is the local launcher, `worker`, `status`, `fit`, `bench`, `data`, `launch`
and `dht` the other commands; `client_flags` declares the flags of every command that calls a
coordinator. Nothing below this package imports it.
"""
