"""Tests of worker/: the client's retries, patience, hostile servers, DiLoCo arithmetic with an in-process worker."""
