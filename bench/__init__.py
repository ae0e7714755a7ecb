"""Benchmarks for the Tidings service, run as ``python -m bench <name>``.

Each benchmark starts a real ``tidings serve`` subprocess (see ``bench.harness``),
drives it from this separate process and prints one line of JSON on stdout.
"""
