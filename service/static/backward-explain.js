// @ts-check
// A clicked gradient cell explained with its numbers (explain.js hands every grad_* cell here):
// the formula of its step of the backward, the page's numbers in it (lib/backward.js computes them
// again from the gradient after it and the forward's arrays; the sinks' and T5's table's cells
// lib/backward-scores.js), a table of the terms summed, and the page's total beside the service's;
// "← how … was computed" walks to the gradient it came from where that is the same cell (dS from
// dP, each score's gradient from the next's). A gradient the page does not compute yet (MLA, the
// norms' weights) says so and shows the service's number and step.
import { gradientCell, isGradient } from "./lib/backward.js";
import { cellTitle, el, fmt, table, totalLine } from "./lib/explain-parts.js";
import { slotOf } from "./lib/layers.js";

export { isGradient };

const DONE =
  "dO, dP = dO Vᵀ, D = rowsum(dO ∘ O), dS = P ∘ (dP − D), the score steps back to grad_scores (the mask and the bias, the softcap, the scale), the sinks' and T5's table's gradients, dQ, dK, dV, RoPE's and the temperature's backward, the q/k norms' and the clamp's backward, the new keys' and values' with past, the gate's product (grad_concat, grad_gate), /multihead's block (W_o, the residual, the layer norm and their parameters) and the projections (grad_x, the weights' and biases' gradients)";

/** Whose cell it is: query i → key j for a map of the scores or the weights, else the row's
 * token and the feature. */
function who(ctx, r) {
  const { i, j } = ctx;
  const tokens = ctx.data.tokens,
    keys = ctx.data.context_tokens || tokens;
  const said = (list, n) => (Array.isArray(list) && list[n] !== undefined ? ` “${list[n]}”` : "");
  const slot = slotOf(r.of);
  if (slot === "scores" || slot === "weights")
    return `query ${i}${said(tokens, i)} → key ${j}${said(keys, j)}`;
  const side = slot ?? r.of;
  const keyRow = side === "k" || side === "v";
  return `${keyRow ? "key" : "query"} ${i}${said(keyRow ? keys : tokens, i)}, feature ${j}`;
}

const TERMS = {
  dP: (r, i, j) => ["c", `dO[${i}][c]`, `${r.vName}[${j}][c]`, "product"],
  dQ: (r, i, j) => ["j", `${r.gs}[${i}][j]`, `${r.other}[j][${j}]`, "product"],
  dK: (r, i, j) => ["i", `${r.gs}[i][${i}]`, `${r.other}[i][${j}]`, "product"],
  dV: (r, i, j) => ["i", `weights[i][${i}]`, `dO[i][${j}]`, "product"],
};

/** With `past`: the new token's row is the cache's row P + i of the keys the scores read. */
function cacheNote(note, r, i, what) {
  note(
    `With past: the scores read the cache's ${r.cached} ${what}s then the new tokens', so new ${what} ${i} is column ${r.col}; the cache's own rows' gradient is grad_past_${what === "key" ? "k" : "v"}.`,
  );
}

function terms(box, head, list, mark = -1) {
  box.append(
    table(
      head,
      list.map((x) => [String(x.c), fmt(x.a), fmt(x.b), fmt(x.value)]),
      mark,
    ),
  );
}

/** A table of terms summed over rows (and batch items: "b.i"). */
function rowTerms(box, head, list) {
  const row = (x) => (x.item === null || x.item === undefined ? String(x.c) : `${x.item}.${x.c}`);
  box.append(
    table(
      head,
      list.map((x) => [row(x), fmt(x.a), fmt(x.b), fmt(x.value)]),
    ),
  );
}

// each kind's lines: f a formula line, note a remark
const LINES = {
  dO(box, r, ctx, f, note) {
    const { i, j } = ctx;
    if (r.share)
      f(
        `grad_output[${i}][${j}] = dO[${i}][${j}] = grad_concat[${i}][${ctx.head}·${r.share.dv} + ${j}] = grad_concat[${i}][${r.share.col}]: head ${ctx.head}'s columns of the concat's gradient`,
      );
    else if (r.sum)
      f(`grad_output[${i}][${j}] = dO[${i}][${j}] = 1: "sum", loss = the sum of the last array`);
    else
      f(
        `grad_output[${i}][${j}] = dO[${i}][${j}]: ∂loss/∂ the last array, as the request gives it`,
      );
  },
  dP(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(
      `${r.name}[${i}][${j}] = dP[${i}][${j}] = Σ_c dO[${i}][c] · ${r.vName}[${j}][c]  (dP = dO Vᵀ)`,
    );
    terms(box, TERMS.dP(r, i, j), r.terms);
    note(
      `How the loss moves with the weight P[${i}][${j}]: the values row ${j} dotted with dO's row ${i}.`,
    );
  },
  dS(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(`${r.name}[${i}][${j}] = dS[${i}][${j}] = P[${i}][${j}] · (dP[${i}][${j}] − D[${i}])`);
    f(`= ${fmt(r.p)} · (${fmt(r.dp)} − ${fmt(r.D.total)})`);
    f(`D[${i}] = Σ_c dO[${i}][c] · output[${i}][c]  (= Σ_k P[${i}][k] · dP[${i}][k])`);
    terms(box, ["c", `dO[${i}][c]`, `output[${i}][c]`, "product"], r.D.terms);
    const said = r.D.service === undefined ? "" : ` (the service's row_dot: ${fmt(r.D.service)})`;
    f(`D[${i}] = ${fmt(r.D.total)}${said}`);
    if (r.filled)
      note(
        `Row ${i} is fully masked and fully_masked_rows "uniform" gave it the weights 1/S, which do not depend on the scores: dS is 0.`,
      );
    else if (r.masked) note(`Key ${j} is masked for query ${i}: P = 0, so dS = 0.`);
    note(
      "The softmax's Jacobian is not diagonal: D subtracts the row's dP weighted by P. dS = P ∘ dP without it is the mistake softmax_grad_diagonal.",
    );
  },
  "score-back"(box, r, ctx, f) {
    const { i, j } = ctx;
    const g = `grad_${r.next}[${i}][${j}]`;
    if (r.why === "scale")
      f(
        `${r.name}[${i}][${j}] = ${g} · scale = ${fmt(r.g)} · ${fmt(r.factor)}  (${r.next} = ${r.of} · scale)`,
      );
    else if (r.why === "softcap") {
      f(
        `${r.name}[${i}][${j}] = ${g} · (1 − tanh²(${r.of}[${i}][${j}] / c)), c = softcap = ${fmt(r.c)}`,
      );
      f(
        `= ${fmt(r.g)} · (1 − tanh(${fmt(r.x)} / ${fmt(r.c)})²) = ${fmt(r.g)} · (1 − ${fmt(r.t)}²) = ${fmt(r.g)} · ${fmt(r.factor)}`,
      );
    } else
      f(
        `${r.name}[${i}][${j}] = ${g} = ${fmt(r.g)}: ${r.next} adds a constant to ${r.of} (${r.nextKind === "mask" ? "the mask's 0 or −∞" : "the position bias"}), whose derivative is 1`,
      );
  },
  "sink-back"(box, r, ctx, f, note) {
    const { j } = ctx;
    const h = r.head === null ? "" : `, head ${r.head}`;
    const batched = r.terms.some((x) => x.item !== null);
    f(
      `${r.name}[${j}] = Σ_i p_sink[i] · (0 − D[i]) = −Σ_i sink_weights[i] · D[i], over the rows${batched ? " and batch items (b.i: item b, row i)" : ""}${h}`,
    );
    f("D[i] = Σ_c dO[i][c] · output[i][c]  (the row's row_dot)");
    rowTerms(box, [batched ? "b.i" : "i", "sink_weights[i]", "D[i]", "−p_sink · D"], r.terms);
    note(
      "The sink is one more logit in each row's softmax, with no value: its dP is 0, so its dS is p_sink · (0 − D). Its gradient is that summed over the rows it joined (a padded row gives it 0, a fully masked row has D = 0).",
    );
  },
  "bias-table-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const g = `grad_${r.biased}`;
    const batched = r.terms.some((x) => x.item !== null);
    f(
      `${r.name}[${i}][${j}] = Σ ${g}[q][k] over the (query q, key k) cells whose bucket(p'_k − p_q) is ${i}${r.head === null ? "" : `, head ${r.head}`}${batched ? ", summed over the batch items (b.query: item b's query)" : ""}`,
    );
    const side = r.bidirectional
      ? `${r.perSide} buckets a side (keys after the query from bucket ${r.perSide})`
      : `${r.perSide} buckets (earlier keys only)`;
    f(
      `T5's buckets: ${side}; distances below ${r.exact} one bucket each, larger ones logarithmic bins up to max_distance ${r.maxDistance}`,
    );
    const who = (x) => (x.item === null ? "" : `${x.item}.`);
    box.append(
      table(
        [batched ? "b.query" : "query", "key", "p'_k − p_q", "bucket", `${g}[q][k]`],
        r.terms.map((x) => [`${who(x)}${x.i}`, String(x.j), String(x.rel), String(i), fmt(x.a)]),
      ),
    );
    if (r.terms.length === 0) note(`No (query, key) cell falls in bucket ${i}: its gradient is 0.`);
    note(
      "The bias is table[bucket][head] added to the scores after the scale, so each cell's gradient passes to its table entry unchanged; cells sharing a bucket add up.",
    );
  },
  dQ(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(
      `${r.name}[${i}][${j}] = dQ[${i}][${j}] = Σ_j ${r.gs}[${i}][j] · ${r.other}[j][${j}]  (dQ = dS·scale K)`,
    );
    terms(box, TERMS.dQ(r, i, j), r.terms);
    note(`${r.gs} is dS · scale: the scale is in it, and ${r.other} is the keys the scores read.`);
  },
  dK(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const k = r.col ?? i;
    f(
      `${r.name}[${i}][${j}] = dK[${i}][${j}] = Σ_i ${r.gs}[i][${k}] · ${r.other}[i][${j}]  (dK = (dS·scale)ᵀ Q)`,
    );
    terms(box, TERMS.dK(r, k, j), r.terms);
    note(`${r.gs} is dS · scale; ${r.other} is the queries the scores read.`);
    if (r.cached) cacheNote(note, r, i, "key");
  },
  dV(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const k = r.col ?? i;
    f(`${r.name}[${i}][${j}] = dV[${i}][${j}] = Σ_i P[i][${k}] · dO[i][${j}]  (dV = Pᵀ dO)`);
    terms(box, TERMS.dV(r, k, j), r.terms);
    if (r.cached) cacheNote(note, r, i, "value");
  },
  "norm-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const n = r.terms.length;
    const f0 = r.weighted ? (r.zeroCentered ? "(1 + w)" : "w") : "1";
    const centre = r.type === "layer" ? " − mean(g)" : "";
    const at = r.at;
    f(
      `${r.name}[${i}][${j}] = (g[${at}]${centre} − x̂[${at}] · mean(g · x̂)) / σ, g = ${f0} · grad_${r.next}[${i}], over the ${n} features ${r.over === "projection" ? "of the row's whole projection (every head)" : "of the head's row"}`,
    );
    f(
      r.type === "layer"
        ? `x̂ = (x − mean) / σ, mean = ${fmt(r.mean)}, σ = √(var + eps) = ${fmt(r.sigma)} (eps = ${fmt(r.eps)}, layer norm)`
        : `x̂ = x / σ, σ = √(mean(x²) + eps) = ${fmt(r.sigma)} (eps = ${fmt(r.eps)}, RMS norm)`,
    );
    box.append(
      normTable(
        ["t", `grad_${r.next}[t]`, f0 === "1" ? "f" : `${f0}[t]`, "g[t]", "x̂[t]", "g[t] · x̂[t]"],
        r.terms,
        at,
      ),
    );
    f(`${r.type === "layer" ? `mean(g) = ${fmt(r.meanG)}, ` : ""}mean(g · x̂) = ${fmt(r.meanGX)}`);
    f(
      `= (${fmt(r.g)}${r.type === "layer" ? ` − ${fmt(r.meanG)}` : ""} − ${fmt(r.xt)} · ${fmt(r.meanGX)}) / ${fmt(r.sigma)}`,
    );
    note(
      "The norm's Jacobian is not diagonal: every feature moves σ, so the gradient loses its part along x̂ (and, for a layer norm, its mean). The weight multiplies the gradient before that.",
    );
  },
  "clip-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(
      r.passed
        ? `${r.name}[${i}][${j}] = grad_${r.next}[${i}][${j}] = ${fmt(r.g)}: |${r.of}[${i}][${j}]| = |${fmt(r.before)}| ≤ c = ${fmt(r.c)}, the clamp passed it`
        : `${r.name}[${i}][${j}] = 0: |${r.of}[${i}][${j}]| = |${fmt(r.before)}| > c = ${fmt(r.c)}, the clamp cut it (grad_${r.next}[${i}][${j}] = ${fmt(r.g)} stops here)`,
    );
    note(
      "clamp(x, −c, c)'s derivative is 1 inside [−c, c] and 0 where it clipped (torch.clamp's).",
    );
  },
  "rope-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const g = `grad_${r.next}[${i}]`;
    if (r.pair < 0) {
      f(
        `${r.name}[${i}][${j}] = ${g}[${j}] = ${fmt(r.a)}: feature ${j} is past the turned ones, RoPE left it`,
      );
      return;
    }
    f(
      r.first
        ? `${r.name}[${i}][${j}] = ${g}[${r.f}] · cos φ + ${g}[${r.h}] · sin φ, pair ${r.pair} turned back by −φ (RoPE's transpose)`
        : `${r.name}[${i}][${j}] = ${g}[${r.h}] · cos φ − ${g}[${r.f}] · sin φ, pair ${r.pair} turned back by −φ (RoPE's transpose)`,
    );
    const gain = r.gain === 1 ? "" : ` (× the gain ${fmt(r.gain)})`;
    f(`φ = ${fmt(r.phi)} at position ${r.pos}; cos φ = ${fmt(r.c)}, sin φ = ${fmt(r.s)}${gain}`);
    f(
      r.first
        ? `= ${fmt(r.a)} · ${fmt(r.c)} + ${fmt(r.b)} · ${fmt(r.s)}`
        : `= ${fmt(r.b)} · ${fmt(r.c)} − ${fmt(r.a)} · ${fmt(r.s)}`,
    );
    note(
      "The rotation's transpose is the rotation by −φ: the gradient turns back the way the row turned.",
    );
  },
  "temper-back"(box, r, ctx, f) {
    const { i, j } = ctx;
    f(
      `${r.name}[${i}][${j}] = grad_${r.next}[${i}][${j}] · τ(p) = ${fmt(r.g)} · ${fmt(r.factor)}, query ${i} at p = ${r.p}`,
    );
  },
  "residual-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(`${r.name}[${i}][${j}] = grad_residual[${i}][${j}] = ${fmt(r.g)}`);
    note(
      "residual = x + projected: its derivative by projected is 1, so the residual's gradient passes on unchanged (and x gets it too: grad_x's residual share).",
    );
  },
  "ln-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const n = r.terms.length;
    f(
      `${r.name}[${i}][${j}] = (g[${j}] − mean(g) − x̂[${j}] · mean(g · x̂)) / σ, g = γ · grad_layer_norm[${i}], over the ${n} features of row ${i}`,
    );
    f(
      `x̂ = (${r.before}[${i}] − mean) / σ, mean = ${fmt(r.mean)}, σ = √(var + eps) = ${fmt(r.sigma)} (eps = ${fmt(r.eps)})`,
    );
    box.append(
      normTable(
        ["t", `grad_layer_norm[${i}][t]`, "γ[t]", "g[t]", "x̂[t]", "g[t] · x̂[t]"],
        r.terms,
        j,
      ),
    );
    f(`mean(g) = ${fmt(r.meanG)}, mean(g · x̂) = ${fmt(r.meanGX)}`);
    f(`= (${fmt(r.g)} − ${fmt(r.meanG)} − ${fmt(r.xt)} · ${fmt(r.meanGX)}) / ${fmt(r.sigma)}`);
    note(
      "The layer norm's Jacobian is not diagonal: every feature of the row moves the mean and σ, so the gradient loses its mean and its part along x̂.",
    );
  },
  "gate-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(
      `${r.name}[${i}][${j}] = grad_gated[${i}][${j}] · ${r.by}[${i}][${j}] = ${fmt(r.a)} · ${fmt(r.b)}  (gated = concat ∘ gate)`,
    );
    note(
      r.by === "gate"
        ? "The gate multiplies the concat feature by feature: the concat's gradient is the gated one's times the gate."
        : "The gate's gradient is the gated one's times the concat; back through the sigmoid it is times gate · (1 − gate) (grad_gate_w, grad_gate_b).",
    );
  },
  "concat-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const w = r.layout === "out_in" ? `W_o[o][${j}]` : `W_o[${j}][o]`;
    f(
      `${r.name}[${i}][${j}] = Σ_o grad_projected[${i}][o] · ${w}  (${r.name} = dY W_oᵀ, dY = grad_projected)`,
    );
    terms(box, ["o", `grad_projected[${i}][o]`, w, "product"], r.terms);
    if (r.layout === "identity")
      note("W_o was not given: it is the identity (its default), so grad_concat = grad_projected.");
  },
  "x-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const parts = r.parts.map(
      (p) => `Σ_c d${p.side.toUpperCase()}[${i}][c] · W_${p.side}[${j}][c]`,
    );
    if (r.residual !== null) parts.push(`grad_residual[${i}][${j}]`);
    f(`${r.name}[${i}][${j}] = ${parts.join(" + ")}`);
    for (const p of r.parts) {
      const w = p.layout === "out_in" ? `W_${p.side}[c][${j}]` : `W_${p.side}[${j}][c]`;
      const d = `grad_${p.side}`;
      f(`${p.side}'s term: Σ_c ${d}[${i}][c] · ${w} = ${fmt(p.total)}`);
      terms(box, ["c", `${d}[${i}][c]`, w, "product"], p.terms);
    }
    const sums = r.parts.map((p) => fmt(p.total));
    if (r.residual !== null) sums.push(fmt(r.residual));
    f(`= ${sums.join(" + ")}`);
    if (ctx.endpoint === "multihead")
      note(
        "d<side> is the heads' grad_q … side by side (a key/value head's: its query heads' summed).",
      );
    if (r.residual !== null)
      note("residual = x + projected: x gets the residual's gradient as well as the projections'.");
  },
  "weight-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const W = `W_${r.side}`;
    const out = r.side === "o";
    const x = out ? "concat" : "x";
    const d = out ? "grad_projected" : `grad_${r.side}`;
    const layout =
      r.layout === "out_in" ? ` (out_in: ${W}[${r.m}][${r.c}] is stored [${r.c}][${r.m}])` : "";
    f(
      `${r.name}[${i}][${j}] = ∂loss/∂${W}[${r.m}][${r.c}] = Σ_i ${x}[i][${r.m}] · ${d}[i][${r.c}], summed over the tokens and batch items${layout}`,
    );
    rowTerms(box, ["i", `${x}[i][${r.m}]`, `${d}[i][${r.c}]`, "product"], r.terms);
    if (!out && ctx.endpoint === "multihead")
      note(`${d} is the heads' side by side (a key/value head's: its query heads' summed).`);
  },
  "bias-back"(box, r, ctx, f) {
    const { j } = ctx;
    const d = r.side === "o" ? "grad_projected" : `grad_${r.side}`;
    f(
      `${r.name}[${j}] = Σ_i ${d}[i][${j}], summed over the tokens and batch items (b is added to every row)`,
    );
    rowTerms(box, ["i", `${d}[i][${j}]`, "· 1", "term"], r.terms);
  },
  "ln-param-back"(box, r, ctx, f) {
    const { j } = ctx;
    f(
      r.beta
        ? `${r.name}[${j}] = Σ_i grad_layer_norm[i][${j}], summed over the tokens and batch items (β is added to every row)`
        : `${r.name}[${j}] = Σ_i grad_layer_norm[i][${j}] · x̂[i][${j}], x̂ the normalised ${r.before}, summed over the tokens and batch items`,
    );
    rowTerms(box, ["i", `grad_layer_norm[i][${j}]`, `x̂[i][${j}]`, "term"], r.terms);
  },
  unexplained(box, r, ctx, f, note) {
    note(
      `The page does not compute ${r.name} yet (it computes ${DONE}); the number is the service's.`,
    );
    if (r.step) f(`The service's step: ${r.step}`);
  },
};

// a bias's or a norm weight's gradient: one row, its cells [j]
const FLAT = new Set(["bias-back", "ln-param-back", "sink-back"]);
// kinds whose cell is not a (query or token, feature) pair: no "who" line
const NO_WHO = new Set(["weight-back", "bias-table-back"]);

// the gradient a cell came from, cell for cell (the way back), by kind
const BEFORE = {
  dS: () => "grad_weights",
  "score-back": (r) => `grad_${r.next}`,
  "temper-back": (r) => `grad_${r.next}`,
  "residual-back": () => "grad_residual",
};

/** A norm's backward term by term: each feature t's incoming gradient, weight, g (their
 * product), x̂ and g · x̂; row `mark` is the clicked feature's. */
function normTable(head, terms, mark) {
  const row = (x) => [String(x.c), fmt(x.a), fmt(x.gamma), fmt(x.g), fmt(x.xhat), fmt(x.value)];
  return table(head, terms.map(row), mark);
}

/** The explanation of gradient cell ctx as an element, or null when the answer lacks it. */
export function explainGradient(ctx) {
  const r = gradientCell(ctx);
  if (!r) return null;
  const { i, j } = ctx;
  const flat = FLAT.has(r.kind);
  const box = el("section", "explain explain-gradient");
  box.append(cellTitle(`${r.name}${flat ? "" : `[${i}]`}[${j}]`, ctx));
  if (!flat && !NO_WHO.has(r.kind))
    box.append(el("p", "explain-who", `${who(ctx, r)}: ∂loss/∂${r.of}[${i}][${j}]`));
  const f = (s) => box.append(el("p", "explain-formula", s));
  const note = (s) => box.append(el("p", "explain-note", s));
  LINES[r.kind](box, r, ctx, f, note);
  box.append(
    r.total === undefined
      ? el("p", "explain-total", `= ${fmt(r.service)} (the service's number)`)
      : totalLine(r.total, r.service, ctx.request.decimals),
  );
  const before = BEFORE[r.kind] && BEFORE[r.kind](r);
  if (before) {
    const back = el("button", "secondary explain-back", `← how ${before}[${i}][${j}] was computed`);
    back.type = "button";
    Object.assign(back.dataset, { step: before, i: String(i), j: String(j) });
    box.append(back);
  }
  return box;
}
