"""Exercise 7's checker: Stationary-W forward and backward, every rank's blocks against the serial reference."""

from refconv.testing.strategies import ConvProblem
from tutorials.exercises.checkers.common import ChannelCase, channel_parts, w_cases
from tutorials.exercises.harness import Part

TITLE = "Stationary-W forward and backward"
LEVEL, MINUTES = 3, 60  # difficulty 1 to 3, and a learner's time

run_forward, run_backward, score_of = channel_parts("w")
PARTS = [Part("forward", w_cases(), run_forward, str), Part("backward", w_cases(), run_backward, str)]
score = score_of(ChannelCase(ConvProblem(N=2, C=8, F=8, H=8, W=8, Kh=3, Kw=3, padding=(1, 1)), 4, p_f=2))
