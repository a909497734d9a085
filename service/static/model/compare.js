// @ts-check
// "Compare with my numbers" on the trained-model tab: the chosen layer's trace is drawn by
// render.js as the /multihead answer it is, with the request it answers ({x: trace.x_in,
// tokens, ...layer_weights}: model/weights.js), so that the page's compare (compare.js) offers
// its boxes under the layer's outputs, named as the trace names them (q, heads.0.weights,
// concat, output …). Its Compare is not sent to /multihead (the layer's weights again, megabytes
// of them) but to POST /model for the same model, text and layer with `expected` (and the
// tolerance): the answer's trace carries `comparison` and `first_mismatch` as /multihead's
// does, and is drawn in place of the one before (verdict.js: the verdict, the first mismatch
// and its diagnosis).
import { layerRequest } from "./weights.js";

/**
 * The result render.js draws for a POST /model answer's trace: {ep: "multihead", body, data,
 * via}. `body` is the /multihead request the trace answers when the answer has the layer's
 * weights (else the /model request: the trace is drawn, its projections unexplained); `via`
 * sends a Compare to POST /model and puts the compared trace into `answer`.
 * @param {{body: any, data: any, layer: number | null}} answer the POST /model request
 * (`body`: model and text), its answer, and the layer whose trace the answer holds
 */
export function layerResult(answer) {
  const { body, data, layer } = answer;
  const request = layerRequest(data);
  const via = {
    /** POST /model for the layer, with the arrays to compare. */
    request: (compared) => {
      const sent = {
        model: body.model,
        text: body.text,
        layer,
        include: ["tokens", "trace"],
        expected: compared.expected,
      };
      if (compared.tolerance) sent.tolerance = compared.tolerance;
      return { ep: "model", body: sent };
    },
    /** The compared trace, kept as the model answer's own (its x_in with it). */
    answer: (got) => {
      data.trace = got.trace;
      return got.trace;
    },
  };
  return { ep: "multihead", body: request || { ...body, layer }, data: data.trace, via };
}

/** What the layer's cells explain and what Compare does, in words (after draw.js's sentence on
 * what the layer is). */
export function layerNote(data) {
  const explained = layerRequest(data)
    ? "Every cell explains itself with its numbers: a head's q, k and v (x_in's row times a column of W_q, W_k or W_v, plus the bias), its scores, weights and output, the concat, concat · W_o + b_o, the residual and the layer norm (γ and β), from the layer's weights, which came with the trace (layer_weights). "
    : "A cell of a head's scores, weights or output explains itself; the layer's weights did not come with this answer, so q, k, v and the steps after the heads are the service's numbers without an explanation. ";
  return (
    explained +
    "Compare with my numbers: paste your arrays of this layer under the outputs they are (q, heads.0.weights, concat, output …) and Compare: the page sends them to POST /model as `expected` for this model, text and layer, and shows the first difference and, when it can, the mistake behind it."
  );
}
