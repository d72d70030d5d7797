"""Benchmarks in the manner of nccl-tests: `mpiexec -n N python -m benchmarks.<collective>`."""
