"""Exercise 4's checker: a 2-D halo exchange with corners and its adjoint; the bonus, 3-D."""

from tutorials.exercises.checkers.common import HaloCase, halo_cases, halo_parts, halo_score
from tutorials.exercises.harness import Part

TITLE = "a 2-D halo with corners (bonus: 3-D)"
LEVEL, MINUTES = 2, 60  # difficulty 1 to 3, and a learner's time

run_exchange, run_return = halo_parts("halo_exchange", "halo_return")
run_exchange_3d, run_return_3d = halo_parts("halo_exchange_3d", "halo_return_3d")
PARTS = [Part("halo_exchange", halo_cases(2, ranks=(1, 2, 3, 4, 6)), run_exchange, str),
         Part("halo_return", halo_cases(2, ranks=(1, 2, 3, 4, 6)), run_return, str),
         Part("halo_exchange_3d", halo_cases(3, ranks=(1, 2, 4, 8)), run_exchange_3d, str, bonus=True),
         Part("halo_return_3d", halo_cases(3, ranks=(1, 2, 4, 8)), run_return_3d, str, bonus=True)]

score = halo_score("halo_exchange", "halo_return", HaloCase((2, 2), (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), n=2, c=3))
