// @ts-check
// A projection's arithmetic, a leaf shared by the forward's explanations (model/weights.js:
// q = x · W_q + b_q, projected = concat · W_o + b_o) and the backward's (lib/backward-block.js:
// the same weights read the other way): W[t][c] as the request's weight_layout stores it
// (in_out: W is (d_in, d_out), x · W; out_in: (d_out, d_in), x · Wᵀ, torch's nn.Linear).

/** W[t][c] (input feature t, output column c) of a weight stored in `layout` ("identity": W
 * not given where its default is the identity, W_o's). */
export function weightAt(layout, w, t, c) {
  if (layout === "identity") return t === c ? 1 : 0;
  return layout === "out_in" ? w[c][t] : w[t][c];
}

/** x[i] · W[:, c] + b[c] (x the row): the terms and their sums. */
export function projection(layout, x, w, b, c) {
  const terms = x.map((xt, t) => {
    const wt = weightAt(layout, w, t, c);
    return { t, x: xt, w: wt, value: xt * wt };
  });
  const dot = terms.reduce((s, term) => s + term.value, 0);
  const bias = Array.isArray(b) ? b[c] : 0;
  return { terms, dot, bias, total: dot + bias };
}
