"""Exercise 3's checker: a 1-D halo exchange and its adjoint on uneven shards, against the definition."""

from tutorials.exercises.checkers.common import HaloCase, halo_cases, halo_parts, halo_score
from tutorials.exercises.harness import Part

TITLE = "a 1-D halo exchange with uneven shards"
LEVEL, MINUTES = 2, 40  # difficulty 1 to 3, and a learner's time

run_exchange, run_return = halo_parts("halo_exchange", "halo_return")
PARTS = [Part("halo_exchange", halo_cases(1, ranks=(1, 2, 3, 4, 5)), run_exchange, str),
         Part("halo_return", halo_cases(1, ranks=(1, 2, 3, 4, 5)), run_return, str)]

score = halo_score("halo_exchange", "halo_return", HaloCase((4,), (10,), (3,), (2,), (2,), (1,), n=2, c=3))
