// @ts-check
// The chosen layer's weights (POST /model's `layer_weights`: the /multihead request the trace
// was computed from, less x = trace.x_in and the tokens) and what they explain: a cell of a
// head's q, k or v (x_in's row dotted with a column of W_q, W_k or W_v, plus the bias), of the
// concat (a head's output), of concat · W_o + b_o, of the residual (x_in + projected), of the
// layer norm ((z − mean) / √(var + eps) · γ + β over the row's features), of the output (the
// layer norm's), of the average weights (the heads' mean) and of x_in (the hidden states the
// layer before made). The cells of the heads' score maps, weights and outputs are explained by
// the page's own explain.js (render.js); these are the cells it has no weights for. Each is
// computed again in float64 from the numbers the answer holds, beside the service's number.
//
// model/compare.js asks `layerRequest` for the request the trace is drawn with (mode.js asks
// for the weights with the trace); a render.js whenDrawn hook (registered here)
// makes those tables' cells clickable when the result drawn is a model layer's.
import { $, state } from "../lib/state.js";
import { backButton, cellTitle, el, fmt, table, totalLine } from "../lib/explain-parts.js";
import { normOf } from "../lib/layers.js";
import { projection as project } from "../lib/projection.js";
import { explain, whenDrawn } from "../render.js";

/** The /multihead request whose answer is `data.trace`: {x: trace.x_in, tokens,
 * ...layer_weights}, or null when the answer has no trace or no weights. */
export function layerRequest(data) {
  const t = data && data.trace,
    w = data && data.layer_weights;
  if (!t || !w || !Array.isArray(t.x_in)) return null;
  return { x: t.x_in, tokens: data.tokens || t.tokens, ...w };
}

// ---- the arithmetic -----------------------------------------------------------------------

/** x[i] · W[:, c] + b[c] in the request's weight_layout (lib/projection.js). */
const projection = (request, x, w, b, c) => project(request.weight_layout, x, w, b, c);

const SIDE = {
  q: { w: "w_q", b: "b_q", width: "d_k", kv: false },
  k: { w: "w_k", b: "b_k", width: "d_k", kv: true },
  v: { w: "w_v", b: "b_v", width: "d_v", kv: true },
};

/** Head `h`'s q, k or v [i][c]: column c of the head's slice of W (the key/value head a query
 * head shares, with fewer key/value heads). */
function sideCell(ctx, side, h, i, c) {
  const { request, data } = ctx;
  const s = SIDE[side];
  const width = Number(data[s.width]);
  const group = s.kv ? Number(data.num_heads) / Number(data.num_kv_heads || data.num_heads) : 1;
  const owner = Math.floor(h / group); // the key/value head that query head h reads
  const col = owner * width + c;
  const p = projection(request, request.x[i], request[s.w], request[s.b], col);
  return { kind: "projection", side, owner, col, width, weight: s.w, biasName: s.b, ...p };
}

/** The cell [i][c] of `name` (a layer-wide output or a head's q, k, v) computed again:
 * {kind, total, …} (a shape per kind), or null.
 * @returns {any} */
export function weightCell(ctx) {
  const { name, head, i, j, request, data } = ctx;
  if (head !== null && head !== undefined)
    return name in SIDE ? sideCell(ctx, name, head, i, j) : null;
  if (name === "x_in") return { kind: "input", total: data.x_in[i][j] };
  if (name === "concat") {
    const dv = Number(data.d_v);
    const h = Math.floor(j / dv);
    return { kind: "concat", head: h, feature: j % dv, total: data.heads[h].output[i][j % dv] };
  }
  if (name === "projected") {
    const p = projection(request, data.concat[i], request.w_o, request.b_o, j);
    return { kind: "projection", weight: "w_o", biasName: "b_o", from: "concat", col: j, ...p };
  }
  if (name === "residual") {
    const x = data.x_in[i][j],
      p = data.projected[i][j];
    return { kind: "residual", x, projected: p, total: x + p };
  }
  if (name === "layer_norm" || name === "output") {
    const ln = request.layer_norm;
    if (!ln || typeof ln !== "object" || !Array.isArray(data.residual)) return null;
    const n = normOf(data.residual[i], j, {
      type: "layer",
      eps: Number(ln.eps ?? 1e-5),
      weight: ln.gamma ?? null,
      bias: ln.beta ?? null,
    });
    return { kind: "layer_norm", ...n };
  }
  if (name === "average_weights") {
    const terms = data.heads.map((hd, h) => ({ h, w: hd.weights[i][j] }));
    const sum = terms.reduce((s, x) => s + x.w, 0);
    return { kind: "average", terms, sum, total: sum / terms.length };
  }
  return null;
}

// ---- the explanation ----------------------------------------------------------------------

const WEIGHT = { w_q: "W_q", w_k: "W_k", w_v: "W_v", w_o: "W_o" };
const BIAS = { b_q: "b_q", b_k: "b_k", b_v: "b_v", b_o: "b_o" };
const MANY = 32; // more terms than this are folded (a row of d_model = 384 products)

/** A terms table, folded under a summary when it is long. */
function terms(head, rows, summary) {
  const t = table(head, rows);
  if (rows.length <= MANY) return t;
  const d = el("details", "explain-all-terms");
  d.append(el("summary", null, summary), t);
  return d;
}

/** The explanation of a projection's cell: x[i] · W[:, col] + b[col]. */
function projectionLines(box, r, ctx) {
  const { name, i, j } = ctx;
  const W = WEIGHT[r.weight],
    b = BIAS[r.biasName];
  const from = r.from || "x_in";
  const wAt = (t) =>
    ctx.request.weight_layout === "out_in" ? `${W}[${r.col}][${t}]` : `${W}[${t}][${r.col}]`;
  const f = (s) => box.append(el("p", "explain-formula", s));
  const note = (s) => box.append(el("p", "explain-note", s));
  f(
    `${name}[${i}][${j}] = Σ_t ${from}[${i}][t] · ${wAt("t")} + ${b}[${r.col}], the row ${i} of ${from} dotted with column ${r.col} of ${W}`,
  );
  if (r.side) {
    const shared =
      r.owner !== ctx.head
        ? ` (key/value head ${r.owner}, which query head ${ctx.head} shares)`
        : "";
    note(
      `Head ${ctx.head}'s ${r.side} is columns ${r.col - j} to ${r.col - j + r.width - 1} of ${W}${shared}: its feature ${j} is column ${r.col}.`,
    );
  }
  box.append(
    terms(
      ["t", `${from}[${i}][t]`, wAt("t"), "product"],
      r.terms.map((x) => [String(x.t), fmt(x.x), fmt(x.w), fmt(x.value)]),
      `the ${r.terms.length} products ${from}[${i}][t] · ${wAt("t")}`,
    ),
  );
  f(`= ${fmt(r.dot)} + ${b}[${r.col}] = ${fmt(r.dot)} + ${fmt(r.bias)}`);
}

/** The layer norm's lines: the row's mean and biased variance, then the feature. */
function normLines(box, r, ctx) {
  const { name, i, j } = ctx;
  const f = (s) => box.append(el("p", "explain-formula", s));
  if (name === "output")
    box.append(
      el(
        "p",
        "explain-note",
        "The layer's output is its layer norm's: the residual, normalised over each token's features.",
      ),
    );
  f(
    `${name}[${i}][${j}] = (residual[${i}][${j}] − mean) / √(var + eps) · γ[${j}] + β[${j}], mean and var over the ${r.terms.length} features of row ${i}`,
  );
  box.append(
    terms(
      ["t", `residual[${i}][t]`, "− mean", "(− mean)²"],
      r.terms.map((x) => [String(x.t), fmt(x.x), fmt(x.c), fmt(x.sq)]),
      `the ${r.terms.length} features of residual[${i}]`,
    ),
  );
  f(
    `mean = ${fmt(r.mean)}, var = ${fmt(r.spread)}, eps = ${fmt(r.eps)}, √(var + eps) = ${fmt(r.denom)}`,
  );
  f(
    `= (${fmt(r.terms[j].x)} − ${fmt(r.mean)}) / ${fmt(r.denom)} · ${fmt(r.w)} + ${fmt(r.b)} = ${fmt(r.normed)} · ${fmt(r.w)} + ${fmt(r.b)}`,
  );
}

/** The cell a cell was computed from, walked back to with a button: [name, head, i, j]. */
function before(r, ctx) {
  const { name, i, j } = ctx;
  if (r.kind === "concat") return ["output", r.head, i, r.feature];
  if (name === "projected") return null; // a whole row of concat
  if (r.kind === "residual") return ["projected", null, i, j];
  if (r.kind === "layer_norm") return ["residual", null, i, j];
  return null;
}

/** The explanation of ctx's cell as an element, or null when it is not one of these. */
export function explainWeightCell(ctx) {
  const r = weightCell(ctx);
  if (!r) return null;
  const { name, i, j } = ctx;
  const box = el("section", "explain");
  box.append(cellTitle(`${name}[${i}][${j}]`, ctx));
  const tokens = ctx.data.tokens;
  const keys = r.side === "k" || r.side === "v";
  if (Array.isArray(tokens) && tokens[i] !== undefined)
    box.append(
      el(
        "p",
        "explain-who",
        `${keys ? "key" : name === "average_weights" ? "query" : "token"} ${i} “${tokens[i]}”, ${name === "average_weights" ? `key ${j} “${tokens[j]}”` : `feature ${j}`}`,
      ),
    );
  const f = (s) => box.append(el("p", "explain-formula", s));
  const note = (s) => box.append(el("p", "explain-note", s));
  if (r.kind === "projection") projectionLines(box, r, ctx);
  else if (r.kind === "layer_norm") normLines(box, r, ctx);
  else if (r.kind === "concat") {
    f(
      `concat[${i}][${j}] = head ${r.head}'s output[${i}][${r.feature}] (each head's ${ctx.data.d_v} features side by side: feature ${j} = ${r.head} · ${ctx.data.d_v} + ${r.feature})`,
    );
  } else if (r.kind === "residual") {
    f(
      `residual[${i}][${j}] = x_in[${i}][${j}] + projected[${i}][${j}] = ${fmt(r.x)} + ${fmt(r.projected)}`,
    );
    note(
      "The residual connection: the layer adds what its heads made to the hidden state it was given.",
    );
  } else if (r.kind === "average") {
    f(
      `average_weights[${i}][${j}] = (1/${r.terms.length}) Σ_h heads[h].weights[${i}][${j}] = ${fmt(r.sum)} / ${r.terms.length}`,
    );
    box.append(
      terms(
        ["h", `weights[${i}][${j}]`],
        r.terms.map((x) => [String(x.h), fmt(x.w)]),
        `the ${r.terms.length} heads' weights`,
      ),
    );
  } else if (r.kind === "input") {
    note(
      "x_in is the hidden states entering this layer, as the model's forward made them: the layer before's output (for layer 0, the embeddings: word + position + token type, layer-normed). This layer reads it; it does not make it.",
    );
  }
  box.append(totalLine(r.total, pickService(ctx), ctx.request.decimals));
  const back = before(r, ctx);
  if (back) {
    const [step, h, bi, bj] = back;
    const label = h === null ? `${step}[${bi}][${bj}]` : `head ${h}'s ${step}[${bi}][${bj}]`;
    const go = backButton(label, {
      step,
      i: String(bi),
      j: String(bj),
      head: h === null ? "" : String(h),
    });
    box.append(go);
  }
  return box;
}

/** The service's number of ctx's cell. */
function pickService(ctx) {
  const { data, name, head, i, j } = ctx;
  const m = head === null || head === undefined ? data[name] : data.heads[head][name];
  return m[i][j];
}

// ---- shown --------------------------------------------------------------------------------

/** Shows ctx's explanation in the page's panel (render.js's), or the page's own for a head's
 * scores, weights and output. */
export async function showWeightCell(ctx) {
  const box = explainWeightCell(ctx);
  if (!box) {
    await explain({ endpoint: "multihead", batch: null, ...ctx });
    return;
  }
  const panel = $("explain");
  $("explain-body").replaceChildren(box);
  const back = /** @type {HTMLButtonElement | null} */ (box.querySelector("button.explain-back"));
  if (back)
    back.addEventListener("click", async () => {
      const h = back.dataset.head;
      await showWeightCell({
        ...ctx,
        name: back.dataset.step,
        head: h === "" ? null : Number(h),
        i: +back.dataset.i,
        j: +back.dataset.j,
      });
      /** @type {HTMLElement} */ (
        $("explain-body").querySelector("button.explain-back") || $("explain-close")
      ).focus();
    });
  panel.hidden = false;
  panel.dataset.name = ctx.name;
  panel.dataset.cell = `${ctx.i},${ctx.j}`;
  panel.dataset.head = ctx.head === null || ctx.head === undefined ? "" : String(ctx.head);
  const top = panel.getBoundingClientRect().top;
  if (top < 0 || top > window.innerHeight - 40) panel.scrollIntoView({ block: "nearest" });
}

/** The outputs drawn as tables whose cells these weights explain: a head's q, k and v, and the
 * layer's after its heads. */
const TABLES = new Set([
  "x_in",
  "q",
  "k",
  "v",
  "concat",
  "projected",
  "residual",
  "layer_norm",
  "output",
]);

/** Makes the cells of a drawn table clickable (and focusable: Enter explains). */
function clickable(card, onCell) {
  const t = card.querySelector("table.matrix");
  if (!t || t.classList.contains("by-weights")) return;
  // the layer's output, which render.js's hook leaves without an explanation (a head's output it
  // explains), takes these instead: its cells, without that hook
  if (t.classList.contains("explainable")) t.tBodies[0].replaceWith(t.tBodies[0].cloneNode(true));
  t.classList.add("explainable", "by-weights");
  const body = t.tBodies[0];
  [...body.rows].forEach((tr, i) =>
    [...tr.querySelectorAll("td")].forEach((td, j) => {
      td.tabIndex = 0;
      td.dataset.row = String(i);
      td.dataset.col = String(j);
      td.setAttribute("role", "button");
    }),
  );
  const fire = (td) => onCell(+td.dataset.row, +td.dataset.col);
  body.addEventListener("click", (e) => {
    const td = /** @type {Element} */ (e.target).closest("td[data-row]");
    if (td) fire(td);
  });
  body.addEventListener("keydown", (e) => {
    const target = /** @type {Element} */ (e.target);
    const td = target.closest && target.closest("td[data-row]");
    if (td && (e.key === "Enter" || e.key === " ")) {
      e.preventDefault();
      fire(td);
    }
  });
}

/** The cells of the tables a model layer's weights explain answer a click with their
 * explanation, when the drawn result is a model layer's (model/compare.js: `via`) with its
 * weights. */
function explainWeights(ctx) {
  const r = state.lastResult;
  if (!r || !r.via || r.data !== ctx.data || !ctx.body || !Array.isArray(ctx.body.w_q)) return;
  for (const item of ctx.drawn) {
    if (!item.label) continue;
    const parts = item.label.split(".");
    const name = parts.at(-1);
    const head = parts[0] === "heads" ? Number(parts[1]) : null;
    if (!TABLES.has(name) || item.el.tagName === "FIGURE") continue;
    clickable(item.el, (i, j) =>
      showWeightCell({ data: ctx.data, request: ctx.body, name, head, i, j }).catch((e) => {
        $("explain-body").textContent = `No explanation: ${e.message}`;
        $("explain").hidden = false;
      }),
    );
  }
}
whenDrawn(explainWeights);
