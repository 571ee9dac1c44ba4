"""Exercise 5's checker: Stationary-X forward and backward, every rank's blocks against the serial reference."""

from refconv.testing.strategies import ConvProblem
from tutorials.exercises.checkers.common import ChannelCase, channel_parts, composition_cases
from tutorials.exercises.harness import Part

TITLE = "Stationary-X forward and backward"
LEVEL, MINUTES = 2, 40  # difficulty 1 to 3, and a learner's time

run_forward, run_backward, score_of = channel_parts("x")
# the blocks of C and F are drawn, any sizes of at least 1: a file must slice by layer.c_counts and f_counts
PARTS = [Part("forward", composition_cases(), run_forward, str),
         Part("backward", composition_cases(), run_backward, str)]
score = score_of(ChannelCase(ConvProblem(N=2, C=8, F=8, H=8, W=8, Kh=3, Kw=3, padding=(1, 1)), 4))
