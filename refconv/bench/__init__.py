"""Benchmarks, one ``refconv bench`` command (``refconv/bench/cli.py``).

- ``kernels.py``: the convolution passes of one process against cuDNN or torch;
- ``collectives.py``: allreduce bandwidth of the wrappers against raw mpi4py;
- ``layer.py``: one DistConv2d forward and backward per strategy;
- ``step.py``: one training step of a model;
- ``common.py``: their shared flags, timing across ranks and results lines;
- ``schema.py``: the schema of a results line.
"""
