"""Exercise 1, a reference solution: output and halo arithmetic."""


def output_length(H, K, s, p, d):
    # the last output row's window, [o s - p, o s - p + d (K - 1)], must end inside the padded image
    return (H + 2 * p - d * (K - 1) - 1) // s + 1


def output_block(Ho, P, r):
    base, extra = divmod(Ho, P)
    o0 = r * base + min(r, extra)
    return o0, o0 + base + (1 if r < extra else 0)


def rows_needed(H, P, r, K, s, p, d):
    o0, o1 = output_block(output_length(H, K, s, p, d), P, r)
    lo, hi = o0 * s - p, (o1 - 1) * s - p + d * (K - 1) + 1  # the window the output rows read
    needed = {}
    for q in range(P):
        h0, h1 = output_block(H, P, q)  # the input rows rank q owns: the same split
        if q != r and max(lo, h0) < min(hi, h1):
            needed[q] = (max(lo, h0), min(hi, h1))
    return needed
