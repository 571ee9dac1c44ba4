"""Tests on simulated ranks (refconv.simulated): the multi-rank property tests, run in this process."""
