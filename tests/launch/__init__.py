"""Tests of `rcswarm launch ray` without Ray: plans, usage errors, the KubeRay manifests' commands."""
