"""Tests of the container image recipe and the kustomize base under deploy/."""
