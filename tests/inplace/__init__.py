"""Tests of inplace_extension.inplace, the pure core, and of tests/capi_emulator.py."""
