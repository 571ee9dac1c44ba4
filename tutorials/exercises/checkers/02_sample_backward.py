"""Exercise 2's checker: sample parallelism's backward pass against the serial reference's."""

from refconv import collectives
from refconv import reference as ref
from refconv.testing.strategies import ConvProblem
from tutorials.exercises import score as scoring
from tutorials.exercises.checkers.common import LayerCase, blocks, channel_cases
from tutorials.exercises.harness import Compared, Part, on_ranks

TITLE = "sample parallelism's backward"
LEVEL, MINUTES = 1, 30  # difficulty 1 to 3, and a learner's time
OWN = "the gradient of one rank's own samples: a reduction over the samples is missing"


def cases():
    return channel_cases(min_channels=lambda ranks: 1, min_batch=4, max_batch=5).map(
        lambda c: LayerCase(c.problem.__class__(**{**c.problem.__dict__, "N": max(c.problem.N, c.ranks)}), c.ranks))


def _local(case, comm, x, dy):
    n0, n1 = blocks(case.problem.N, comm.size)[comm.rank]
    x_loc, dy_loc = x[n0:n1].copy(), dy[n0:n1].copy()  # (n_i, C, H, W), (n_i, F, H', W')
    scoring.given(x, dy, x_loc, dy_loc)  # the rank's inputs: not counted in its memory
    return x_loc, dy_loc


def _geometry(p):
    return dict(stride=p.stride, padding=p.padding, dilation=p.dilation)


def data_body(module):
    def body(comm, case, x, w, dy):
        x_loc, dy_loc = _local(case, comm, x, dy)
        with collectives.stats.recording() as region:
            dx_loc = module.backward_data(comm, dy_loc, w, x_loc.shape, **_geometry(case.problem))
            scoring.checkpoint()
        return dx_loc, ", ".join(r.kind for r in region.records) or "none"
    return body


def filter_body(module):
    def body(comm, case, x, w, dy):
        x_loc, dy_loc = _local(case, comm, x, dy)
        scoring.given(w)
        grads = module.backward_filter(comm, x_loc, dy_loc, w.shape, **_geometry(case.problem))
        scoring.checkpoint()
        return grads
    return body


def run_data(module, case):
    p = case.problem
    x, w, _, dy = p.arrays(case.seed)
    got = on_ranks(data_body(module), case.ranks, case, x, w, dy)
    dx = ref.conv2d_backward_data(dy, w, x.shape, **_geometry(p))
    return [Compared("dx_loc", [g[0] for g in got], [dx[n0:n1] for n0, n1 in blocks(p.N, case.ranks)],
                     reduction=p.F * p.Kh * p.Kw),
            Compared("the calls backward_data makes", [g[1] for g in got], ["none"] * case.ranks, exact=True)]


def run_filter(module, case):
    p = case.problem
    x, w, _, dy = p.arrays(case.seed)
    got = on_ranks(filter_body(module), case.ranks, case, x, w, dy)
    dw = ref.conv2d_backward_filter(x, dy, w.shape, **_geometry(p))
    db = ref.conv2d_backward_bias(dy)
    cells = p.N * p.y_shape[2] * p.y_shape[3]
    mine = blocks(p.N, case.ranks)

    def own_samples(grad):
        return lambda: [(OWN, [grad(n0, n1) for n0, n1 in mine])]
    return [Compared("dw", [g[0] for g in got], [dw] * case.ranks, reduction=cells, lookalikes=own_samples(
                lambda n0, n1: ref.conv2d_backward_filter(x[n0:n1], dy[n0:n1], w.shape, **_geometry(p)))),
            Compared("db", [g[1] for g in got], [db] * case.ranks, reduction=cells,
                     lookalikes=own_samples(lambda n0, n1: ref.conv2d_backward_bias(dy[n0:n1])))]


PARTS = [Part("backward_data", cases(), run_data, str), Part("backward_filter", cases(), run_filter, str)]

SCORE_CASE = LayerCase(ConvProblem(N=6, C=4, F=4, H=8, W=8, Kh=3, Kw=3, padding=(1, 1)), 4)


def score(module, solution):
    c = SCORE_CASE
    x, w, _, dy = c.problem.arrays(c.seed)

    def body_of(m):
        def body(comm):
            data_body(m)(comm, c, x, w, dy)
            filter_body(m)(comm, c, x, w, dy)
        return body
    return scoring.compare(c, body_of, module, solution, c.ranks)
