"""What tests share: a test file imports these modules, never another test file (tests/deploy/test_structure.py).

A helper module that starts processes (processes, hivemind, git_repo) serves the tests under tests/swarm/ only.
"""
