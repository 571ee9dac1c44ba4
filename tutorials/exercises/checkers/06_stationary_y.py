"""Exercise 6's checker: Stationary-Y forward and backward, every rank's blocks against the serial reference."""

from refconv.testing.strategies import ConvProblem
from tutorials.exercises.checkers.common import ChannelCase, channel_cases, channel_parts
from tutorials.exercises.harness import Part

TITLE = "Stationary-Y forward and backward"
LEVEL, MINUTES = 2, 40  # difficulty 1 to 3, and a learner's time

run_forward, run_backward, score_of = channel_parts("y")
PARTS = [Part("forward", channel_cases(), run_forward, str), Part("backward", channel_cases(), run_backward, str)]
score = score_of(ChannelCase(ConvProblem(N=2, C=8, F=8, H=8, W=8, Kh=3, Kw=3, padding=(1, 1)), 4))
