// @ts-check
// A clicked gradient cell explained with its numbers (explain.js hands every grad_* cell here):
// the formula of its step of the backward, the page's numbers in it (lib/backward.js computes them
// again from the gradient after it and the forward's arrays; the block's and the projections'
// are lib/backward-block.js's, the sinks' and T5's table's lib/backward-scores.js's, MLA's
// lib/backward-latent.js's), a table of the terms summed, and the page's total beside the
// service's; "← how … was computed" walks to the gradient it came from where that is the same
// cell (dS from dP, each score's gradient from the next's). A gradient the page does not compute
// says so and shows the service's number and step.
import { gradientCell, isGradient } from "./lib/backward.js";
import { backButton, cellTitle, el, fmt, table, totalOrService } from "./lib/explain-parts.js";
import { slotOf } from "./lib/layers.js";

export { isGradient };

const DONE =
  "dO, dP = dO Vᵀ, D = rowsum(dO ∘ O), dS = P ∘ (dP − D), the score steps back to grad_scores (the mask and the bias, the softcap, the scale), the sinks' and T5's table's gradients, dQ, dK, dV, RoPE's and the temperature's backward, the q/k norms' and the clamp's backward, the q/k norms' weights and biases, the new keys' and values' with past and the cache's own (grad_past_k, grad_past_v), a key/value head's gradient as its query heads' summed, the gate's product (grad_concat, grad_gate), /multihead's block (W_o, the residual, the layer norm and their parameters) and the projections (grad_x, the weights' and biases' gradients), and MLA's (Q's and K's nope and rope parts, RoPE's transpose in DeepSeek's layout, the shared key summed over the heads, the latents' up-projections and RMS norms, their weights, grad_x); the projections' under PyTorch's, a state dict's or the heads' names too, with k_eq_v and a positional encoding, a decode step's (past) and OLMo's clamp, read out of a fused projection (qkv_proj.weight, query_key_value.weight, Wqkv.weight, c_attn.weight, c_proj.weight) as the service unpacks it, and the output gate's weights (grad_gate_w, grad_gate_b)";

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
  const keyRow =
    r.keyRows || side === "k" || side === "v" || side === "past_k" || side === "past_v";
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

/** The name of a share of grad_x: d<side>'s, or the gate's dz. */
const xShareName = (p) => (p.side === "gate" ? "dz" : `grad_${p.side}`);

/** W_<side>[m][c] of a share of grad_x as its weight is stored (W_g out_in). */
function xShareWeight(p, c, m) {
  const W = p.side === "gate" ? "W_g" : `W_${p.side}`;
  return p.layout === "out_in" ? `${W}[${c}][${m}]` : `${W}[${m}][${c}]`;
}

/** Where a weight's numbers come from, said. */
function weightSource(p, ctx) {
  const W = p.side === "gate" ? "W_g" : `W_${p.side}`;
  const from = p.from;
  if (from === "in_proj_weight")
    return `${W} is in_proj_weight's ${p.side} rows (PyTorch packs q, k, v one after the other, out_in).`;
  if (from === "heads")
    return `${W} is the heads' own weights side by side (head n's columns n·d …).`;
  if (from === "q_proj" || from === "q_proj.weight" || from === "q_proj_weight") {
    if (p.side === "gate")
      return "W_g is q_proj.weight's gate rows (gate: true: each head's d query rows, then its d gate rows).";
    if (Array.isArray(ctx.data.gate))
      return "W_q is q_proj.weight's query rows (each head's d query rows, then its d gate rows), out_in.";
  }
  if (from === "gate") return "W_g is gate.w as given (out_in).";
  if (p.side === "v" && ctx.request.w_v === undefined && from !== "w_v" && from.includes("k"))
    return `W_v is the keys' weight (${from}): k_eq_v, the values are the keys' projection.`;
  if (from.startsWith("w_") || from === "identity") return `${W} is ${from} as given.`;
  return `${W} is ${from} (a module's weight, out_in as PyTorch stores it).`;
}

/** Indices as runs: "0…7, 24…31". */
function runsSaid(list) {
  const out = [];
  for (const n of list) {
    const last = out.at(-1);
    if (last && n === last[1] + 1) last[1] = n;
    else out.push([n, n]);
  }
  return out.map(([a, b]) => (a === b ? String(a) : `${a}…${b}`)).join(", ");
}

/** Where a weight read out of a fused projection (or c_proj.weight) comes from, said: which
 * rows (GPT-2's Conv1D: columns) of the weight the request gave, and how they are stored. */
function fusedSource(p) {
  const fz = p.fused;
  const W = `W_${p.side}`;
  if (fz.output)
    return fz.conv1d
      ? `W_o is c_proj.weight as stored: GPT-2's Conv1D keeps it [in][out], so W_o[c][o] = c_proj.weight[c][o] (the service reads it as o_proj.weight, transposed).`
      : `W_o is c_proj.weight as GPTBigCode's nn.Linear stores it, [out][in] (out_in): W_o[c][o] = c_proj.weight[o][c].`;
  const where = fz.conv1d ? "columns" : "rows";
  const how = fz.conv1d
    ? `GPT-2's Conv1D stores it [in][out], so ${W}[m][c] = ${fz.name}[m][its c-th column of these]`
    : `out_in as the module stores it, so ${W}[m][c] = ${fz.name}[its c-th row of these][m]`;
  return `${W} is ${fz.name}'s ${where} ${runsSaid(fz.rows)} (qkv_layout "${fz.layout}", as the service unpacks it): ${how}.`;
}

/** The service's unpack step's formula, said (which rows hold what). */
function unpackSaid(ctx) {
  const step = (ctx.data.steps || []).find((st) => st.name === "unpack");
  return step ? `The service's unpack step: ${step.formula}.` : null;
}

/** The gate's terms: the input, grad_gate, gate, dz and their product, row by row. */
function gateTerms(box, r, a) {
  const row = (x) => (x.item === null || x.item === undefined ? String(x.c) : `${x.item}.${x.c}`);
  box.append(
    table(
      ["i", a, `grad_gate[i][${r.c}]`, `gate[i][${r.c}]`, "dz", "product"],
      r.terms.map((x) => [row(x), fmt(x.a), fmt(x.g), fmt(x.s), fmt(x.dz), fmt(x.value)]),
    ),
  );
}

// MLA: what each part's columns are (mla-part), the module whose weight a gradient is, what d is
const MLA_PART = {
  q_nope:
    "Q = [q_nope | q_rope]: the scores read the head's q_nope (its first nope features) and q_rope (its last r) side by side, so each part's gradient is its columns of grad_q_rotated.",
  q_rope:
    "Q = [q_nope | q_rope]: q_rope is Q's last r columns, so its gradient is those columns of grad_q_rotated (RoPE's transpose takes it back to grad_q).",
  k_nope:
    "K = [k_nope | k_rope]: k_nope is the head's first nope columns of K, so its gradient is those columns of grad_k_rotated.",
  rotated:
    "RoPE turns only the rope features: the nope features before RoPE are those after it, so their gradient passes unchanged.",
};
const MLA_MODULE = {
  grad_w_kv_b: "kv_b_proj",
  grad_w_kv_a: "kv_a_proj_with_mqa",
  grad_w_q_a: "q_a_proj",
  grad_b_kv_a: "kv_a_proj_with_mqa",
  grad_b_q_a: "q_a_proj",
};
const MLA_D = {
  "d[k_nope | V]": () => "d[k_nope | V] = each head's [grad_k_nope | grad_v] side by side",
  grad_q: () => "grad_q = each head's grad_q (before RoPE) side by side",
  dC: (r) =>
    `dC = kv_a_proj_with_mqa's output gradient: column c < ${r.kvRank} (kv_lora_rank) kv_a_layernorm's RMS backward of grad_c_kv, (g − x̂ · mean(g · x̂)) / σ with g = w ∘ grad_c_kv; column ${r.kvRank} + t the shared key's dk_pe[i][t] = Σ_h grad_k_h[i][${r.nope} + t] (before RoPE)`,
  dz_q: () =>
    "dz_q = q_a_layernorm's RMS backward of grad_c_q: (g − x̂ · mean(g · x̂)) / σ with g = w ∘ grad_c_q",
};

/** What an MLA weight's gradient d is, as a formula line. */
function mlaD(r, f) {
  f(MLA_D[r.d](r));
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
  "norm-param-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const cell = r.flat ? `[${j}]` : `[${i}][${j}]`;
    const g = `grad_${r.named}`;
    const weight = r.what === "weight";
    const where = r.flat && r.rows > 1 ? ` (row ${r.row} of ${r.rows}, feature ${r.t})` : "";
    f(
      weight
        ? `${r.name}${cell}${where} = Σ ${g}[r][${r.t}] · x̂[r][${r.t}], x̂ the normalised ${r.side === "q" ? "query" : "key"} before the weight`
        : `${r.name}${cell}${where} = Σ ${g}[r][${r.t}] (the bias is added to every normalised vector)`,
    );
    const heads = [...new Set(r.terms.map((x) => x.head))].filter((x) => x !== null);
    const items = r.terms.some((x) => x.item !== null);
    const over = [
      "the rows r",
      items ? "the batch items" : "",
      heads.length ? `the heads ${heads.join(", ")} it serves` : "",
    ];
    note(
      `Summed over ${over.filter(Boolean).join(", ")}: every vector the ${weight ? "weight multiplied" : "bias was added to"}.`,
    );
    if (weight)
      note(
        r.zeroCentered
          ? "With zero_centered the norm multiplies by (1 + w): its derivative by w is still x̂."
          : "y = x̂ · w (+ b): ∂y/∂w is x̂, so the weight's gradient is the incoming gradient times x̂, summed.",
      );
    const label = (x) =>
      [x.item === null ? "" : `b${x.item}`, x.head === null ? "" : `h${x.head}`, `r${x.c}`]
        .filter(Boolean)
        .join(" ");
    box.append(
      table(
        ["row", `${g}[r][${r.t}]`, weight ? `x̂[r][${r.t}]` : "· 1", "term"],
        r.terms.map((x) => [label(x), fmt(x.a), weight ? fmt(x.b) : "1", fmt(x.value)]),
      ),
    );
  },
  "past-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    if (r.side === "k") {
      f(
        `${r.name}[${i}][${j}] = Σ_i ${r.gs}[i][${i}] · ${r.other}[i][${j}]  (dK = (dS·scale)ᵀ Q, the cache's column ${i})`,
      );
      terms(box, ["i", `${r.gs}[i][${i}]`, `${r.other}[i][${j}]`, "product"], r.terms);
    } else {
      f(
        `${r.name}[${i}][${j}] = Σ_i P[i][${i}] · dO[i][${j}]  (dV = Pᵀ dO, the cache's column ${i})`,
      );
      terms(box, ["i", `weights[i][${i}]`, `dO[i][${j}]`, "product"], r.terms);
    }
    note(
      `With past the scores read the cache's ${r.cached} ${r.side === "k" ? "keys" : "values"} first, then the new tokens': cached row ${i} is column ${i}. The cache is an input: its gradient stops here.`,
    );
  },
  "norm-back-kv"(box, r, ctx, f, note) {
    LINES["norm-back"](box, r, ctx, f, note);
    note(
      `Key/value head ${r.kv} serves the query heads ${r.heads.join(", ")}: the norm ran on its copies (the keys repeated to the query heads, with the same mean and σ), so grad_${r.next}[t] is their gradients summed, then back through the norm once.`,
    );
  },
  "k-eq-v"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(
      `${r.name}[${i}][${j}] = the keys' read + the values' read = ${fmt(r.keys.total)} + ${fmt(r.values.total)}`,
    );
    note(
      "k_eq_v: the values are the k given (Gemma 4's full layers), so k is read twice, as the keys (through its steps to the scores) and as the values; its gradient is both reads' summed. grad_v is the values' read alone.",
    );
    note("The keys' read:");
    LINES[r.keys.kind](box, { ...r.keys, name: r.name }, ctx, f, note);
    note("The values' read (grad_v):");
    LINES[r.values.kind](box, { ...r.values, name: "grad_v" }, ctx, f, note);
  },
  "kv-sum"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const copies = r.parts.map((x) => `head ${x.head}'s`).join(" + ");
    f(`${r.name}[${i}][${j}] (key/value head ${r.kv}) = ${copies} copy's gradient`);
    box.append(
      table(
        ["query head", "its copy's gradient"],
        r.parts.map((x) => [String(x.head), fmt(x.total)]),
      ),
    );
    note(
      `Key/value head ${r.kv} is repeated to the query heads ${r.heads.join(", ")} (repeat_kv): its gradient is the sum of theirs. Each copy's:`,
    );
    for (const part of r.parts) {
      note(`Query head ${part.head}:`);
      LINES[part.kind](box, part, { ...ctx, head: part.head }, f, note);
    }
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
  "x-back-forms"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const parts = r.parts.map((p) => `Σ_c ${xShareName(p)}[${i}][c] · ${xShareWeight(p, "c", j)}`);
    if (r.residual !== null) parts.push(`grad_residual[${i}][${j}]`);
    f(`${r.name}[${i}][${j}] = ${parts.join(" + ")}`);
    for (const p of r.parts) {
      const w = xShareWeight(p, "c", j);
      f(`${p.side}'s term: Σ_c ${xShareName(p)}[${i}][c] · ${w} = ${fmt(p.total)}`);
      terms(box, ["c", `${xShareName(p)}[${i}][c]`, w, "product"], p.terms);
    }
    const sums = r.parts.map((p) => fmt(p.total));
    if (r.residual !== null) sums.push(fmt(r.residual));
    f(`= ${sums.join(" + ")}`);
    for (const p of r.parts) note(weightSource(p, ctx));
    if (r.parts.some((p) => p.side === "gate"))
      note(
        "The gate reads x too: gate = sigmoid(x W_gᵀ + b_g), so x gets dz W_g with dz = grad_gate ∘ gate ∘ (1 − gate), the sigmoid's derivative.",
      );
    if (ctx.data.x_in !== undefined)
      note(
        "The projections read x_in = x + the positional encoding; the encoding is a constant, so x's gradient is x_in's.",
      );
    if (r.residual !== null)
      note("residual = x + projected: x gets the residual's gradient as well as the projections'.");
  },
  "weight-back-forms"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const out = r.side === "o";
    const W = `W_${r.side}`;
    const reads = r.reads.map((s) => (out ? "grad_projected" : `grad_${s}`));
    const sumOf = reads.map((d) => `${r.x}[i][${r.m}] · ${d}[i][${r.c}]`).join(" + ");
    f(
      `${r.name}[${i}][${j}] = ∂loss/∂${W}[${r.m}][${r.c}] = Σ_i (${sumOf}), summed over the tokens and batch items (the gradient in_out: [${r.m}][${r.c}])`,
    );
    for (const read of r.reads) {
      const d = out ? "grad_projected" : `grad_${read}`;
      if (r.reads.length > 1)
        f(
          `${read === r.side ? "its own read" : "the values' read"}: Σ_i ${r.x}[i][${r.m}] · ${d}[i][${r.c}]`,
        );
      rowTerms(
        box,
        ["i", `${r.x}[i][${r.m}]`, `${d}[i][${r.c}]`, "product"],
        r.terms.filter((x) => x.read === read),
      );
    }
    note(weightSource(r, ctx));
    if (r.reads.length > 1)
      note(
        "k_eq_v: the values are the keys' projection, one weight read twice, so its gradient is the two reads' summed (there is no grad_w_v).",
      );
    if (r.x === "x_in")
      note(
        "x_in = x + the positional encoding: the projections read it, so their weights' gradients are summed against it, not x.",
      );
    if (!out && ctx.endpoint === "multihead")
      note("grad_q … are the heads' side by side (a key/value head's: its query heads' summed).");
  },
  "bias-back-forms"(box, r, ctx, f, note) {
    const { j } = ctx;
    const reads = r.reads.map((s) => (r.side === "o" ? "grad_projected" : `grad_${s}`));
    f(
      `${r.name}[${j}] = Σ_i ${reads.map((d) => `${d}[i][${j}]`).join(" + ")}, summed over the tokens and batch items (b is added to every row)`,
    );
    for (const read of r.reads) {
      const d = r.side === "o" ? "grad_projected" : `grad_${read}`;
      rowTerms(
        box,
        ["i", `${d}[i][${j}]`, "· 1", "term"],
        r.terms.filter((x) => x.read === read),
      );
    }
    if (r.reads.length > 1)
      note(
        "k_eq_v: the values are the keys' projection, so the key bias gets the values' gradient too.",
      );
  },
  "gate-w-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(
      `${r.name}[${i}][${j}] = ∂loss/∂W_g[${r.c}][${r.m}] = Σ_i ${r.x}[i][${r.m}] · dz[i][${r.c}], dz = grad_gate ∘ gate ∘ (1 − gate), summed over the tokens and batch items`,
    );
    gateTerms(box, r, `${r.x}[i][${r.m}]`);
    note(
      "gate = sigmoid(x W_gᵀ + b_g): back through the sigmoid the gradient is times gate · (1 − gate); W_g is out_in as gate.w is given, [h·d_v][d_model], and so is its gradient.",
    );
  },
  "gate-b-back"(box, r, ctx, f, note) {
    const { j } = ctx;
    f(
      `${r.name}[${j}] = Σ_i dz[i][${j}], dz = grad_gate ∘ gate ∘ (1 − gate), summed over the tokens and batch items`,
    );
    gateTerms(box, r, "1");
    note("b_g is added to every row before the sigmoid: its gradient is dz summed over the rows.");
  },
  "x-back-fused"(box, r, ctx, f, note) {
    const skip = new Set(r.parts.map((p) => weightSource(p, ctx)));
    LINES["x-back-forms"](box, r, ctx, f, (s) => skip.has(s) || note(s));
    for (const p of r.parts) note(p.fused ? fusedSource(p) : weightSource(p, ctx));
    const said = unpackSaid(ctx);
    if (said) note(said);
  },
  "weight-back-fused"(box, r, ctx, f, note) {
    LINES["weight-back-forms"](box, r, ctx, f, (s) => s === weightSource(r, ctx) || note(s));
    const [name, ...at] = r.entry;
    f(
      `W_${r.side}[${r.m}][${r.c}] is ${name}${at.map((n) => `[${n}]`).join("")} of the weight you gave: its gradient is this number, as grad_state_dict's ${name} holds it there.`,
    );
    note(fusedSource(r));
  },
  "bias-back-fused"(box, r, ctx, f, note) {
    LINES["bias-back-forms"](box, r, ctx, f, note);
    const [name, at] = r.entry;
    f(
      `b_${r.side}[${r.c}] is ${name}[${at}] of the bias you gave: its gradient is this number, as grad_state_dict's ${name} holds it there.`,
    );
  },
  "concat-back-fused"(box, r, ctx, f, note) {
    LINES["concat-back"](box, r, ctx, f, note);
    note(fusedSource({ side: "o", fused: r.fused }));
  },
  "mla-part"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(`${r.name}[${i}][${j}] = ${r.whole}[${i}][${r.col}] = ${fmt(r.total)}`);
    note(MLA_PART[r.of] ?? MLA_PART.rotated);
  },
  "mla-rope-back"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const g = (c) => `${r.whole}[${i}][${r.nope + c}]`;
    const [a, b] = [g(r.pair), g(r.half + r.pair)];
    const member = r.first ? "first" : "second";
    f(
      `${r.name}[${i}][${j}]: rope feature t = ${j} − ${r.nope} = ${r.t}, the ${member} member of pair ${r.pair}, turned back by −φ (RoPE's transpose)`,
    );
    f(
      r.interleaved
        ? `interleaved: pair ${r.pair} turned features (${2 * r.pair}, ${2 * r.pair + 1}); DeepSeek's layout returned its first member at rope column ${r.pair} and its second at ${r.half} + ${r.pair}`
        : `half: pair ${r.pair} turned features (${r.pair}, ${r.half + r.pair}), rope columns ${r.pair} and ${r.half} + ${r.pair}`,
    );
    f(r.first ? `= ${a} · cos φ + ${b} · sin φ` : `= ${b} · cos φ − ${a} · sin φ`);
    const gain = r.gain === 1 ? "" : ` (× the gain ${fmt(r.gain)})`;
    f(`φ = ${fmt(r.phi)} at position ${r.pos}; cos φ = ${fmt(r.c)}, sin φ = ${fmt(r.s)}${gain}`);
    f(
      r.first
        ? `= ${fmt(r.a)} · ${fmt(r.c)} + ${fmt(r.b)} · ${fmt(r.s)}`
        : `= ${fmt(r.b)} · ${fmt(r.c)} − ${fmt(r.a)} · ${fmt(r.s)}`,
    );
    if (r.side === "k")
      note(
        "Each head reads the one shared key k_pe: this head's grad_k holds the gradient of its copy; the heads' copies summed are k_pe's gradient (what kv_a_proj_with_mqa's last columns get).",
      );
  },
  "mla-shared-key"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    f(
      `${r.name}[${i}][${j}] = Σ_h grad_k_rotated_h[${i}][${r.col}]  (K_h = [k_nope_h | k_rope]: k_rope's feature ${j} is column ${r.col} of every head's K)`,
    );
    box.append(
      table(
        ["h", `grad_k_rotated_h[${i}][${r.col}]`],
        r.terms.map((x) => [String(x.c), fmt(x.a)]),
      ),
    );
    note(
      "MLA caches one rotated key per token, shared by every head: the loss moves it through each head's scores, so its gradient is the heads' summed.",
    );
  },
  "mla-up"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const kv = r.which === "c_kv";
    const W = kv ? "W_kvb" : "W_qb";
    const d = kv ? "d[k_nope | V]" : "dQ";
    f(
      `${r.name}[${i}][${j}] = Σ_col ${d}[${i}][col] · ${W}[col][${j}]  (${W} = ${kv ? "kv_b_proj" : "q_b_proj"}.weight, out_in)`,
    );
    f(
      `${d}[${i}] = ${kv ? "each head's [grad_k_nope_h | grad_v_h]" : "each head's grad_q_h (before RoPE)"}[${i}] side by side: col = h·${r.per} + c`,
    );
    terms(box, ["col", `${d}[${i}][col]`, `${W}[col][${j}]`, "product"], r.terms);
    note(
      kv
        ? "c_kv W_kvbᵀ makes every head's k_nope and V from the one latent; its transpose takes their gradients back to it (grad_c_kv = [grad_k_nope; grad_v] W_kvb by head)."
        : "c_q W_qbᵀ makes every head's query; its transpose takes their gradients back to the latent.",
    );
  },
  "mla-weight"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const module = MLA_MODULE[r.name] ?? (r.a === "x" ? "q_proj" : "q_b_proj");
    f(
      `${r.name}[${i}][${j}] = Σ_i ${r.a}[i][${r.m}] · ${r.d}[i][${r.c}], summed over the tokens and batch items (in_out: ${module}.weight[${r.c}][${r.m}]'s gradient)`,
    );
    mlaD(r, f);
    rowTerms(box, ["i", `${r.a}[i][${r.m}]`, `${r.d}[i][${r.c}]`, "product"], r.terms);
    note(
      "The weights' gradients are the service's grad_w_… in in_out; grad_state_dict has them out_in.",
    );
  },
  "mla-bias"(box, r, ctx, f) {
    const { j } = ctx;
    f(
      `${r.name}[${j}] = Σ_i ${r.d}[i][${j}], summed over the tokens and batch items (the bias is added to every row)`,
    );
    mlaD(r, f);
    rowTerms(box, ["i", `${r.d}[i][${j}]`, "· 1", "term"], r.terms);
  },
  "mla-norm-weight"(box, r, ctx, f, note) {
    const { j } = ctx;
    const norm = r.which === "c_kv" ? "kv_a_layernorm" : "q_a_layernorm";
    f(
      `${r.name}[${j}] = Σ_i grad_${r.which}[i][${j}] · x̂[i][${j}], summed over the tokens and batch items`,
    );
    f(
      `x̂ = z / √(mean(z²) + eps): z the latent before ${norm} (${r.which === "c_kv" ? "the first kv_lora_rank features of x W_kvaᵀ + b" : "x W_qaᵀ + b"}), ${r.which} = x̂ ∘ w`,
    );
    rowTerms(box, ["i", `grad_${r.which}[i][${j}]`, `x̂[i][${j}]`, "product"], r.terms);
    note(
      `${r.which} = x̂ ∘ w: the weight multiplies each feature, so its gradient is the gradient times x̂.`,
    );
  },
  "mla-x"(box, r, ctx, f, note) {
    const { i, j } = ctx;
    const parts = r.parts.map((p) => `Σ_c ${p.d}[${i}][c] · ${p.w}[c][${j}]`);
    if (r.residual !== null) parts.push(`grad_residual[${i}][${j}]`);
    f(`${r.name}[${i}][${j}] = ${parts.join(" + ")}`);
    for (const n of r.norms) {
      const d = n.which === "c_kv" ? "dC" : "dz_q";
      f(
        `${n.which === "c_kv" ? `dC[${i}][c < kv_lora_rank]` : `dz_q[${i}]`} = (g − x̂ · mean(g · x̂)) / σ, g = w ∘ grad_${n.which}[${i}], through ${n.which === "c_kv" ? "kv_a_layernorm" : "q_a_layernorm"}; σ = ${fmt(n.sigma)}, mean(g · x̂) = ${fmt(n.meanGX)}`,
      );
      box.append(
        normTable(
          ["t", `grad_${n.which}[${i}][t]`, "w[t]", "g[t]", "x̂[t]", "g[t] · x̂[t]"],
          n.terms,
          -1,
        ),
      );
      if (d === "dC")
        f(
          `dC[${i}][kv_lora_rank + t] = dk_pe[${i}][t] = Σ_h grad_k_h[${i}][nope + t] = ${r.pe.map((x) => fmt(x)).join(", ")}`,
        );
    }
    for (const p of r.parts) {
      f(`${p.w}'s share: Σ_c ${p.d}[${i}][c] · ${p.w}[c][${j}] = ${fmt(p.total)}`);
      terms(box, ["c", `${p.d}[${i}][c]`, `${p.w}[c][${j}]`, "product"], p.terms);
    }
    const sums = r.parts.map((p) => fmt(p.total));
    if (r.residual !== null) sums.push(fmt(r.residual));
    f(`= ${sums.join(" + ")}`);
    note(
      "x feeds MLA twice: kv_a_proj_with_mqa (the latent c_kv and the shared key k_pe) and the queries' projection; its gradient sums both shares.",
    );
  },
  unexplained(box, r, ctx, f, note) {
    note(
      `The page does not compute ${r.name} yet (it computes ${DONE}); the number is the service's.`,
    );
    if (r.step) f(`The service's step: ${r.step}`);
  },
};

// a bias's or a norm weight's gradient: one row, its cells [j]
const FLAT = new Set([
  "bias-back",
  "ln-param-back",
  "mla-bias",
  "mla-norm-weight",
  "bias-back-forms",
  "gate-b-back",
  "sink-back",
]);

// kinds whose cell is not a (query or token, feature) pair (a weight's, T5's table's): no
// "who" line
const NO_WHO = new Set([
  "weight-back",
  "norm-param-back",
  "mla-weight",
  "weight-back-forms",
  "weight-back-fused",
  "gate-w-back",
  "bias-table-back",
]);

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
  const flat = FLAT.has(r.kind) || r.flat === true;
  const box = el("section", "explain explain-gradient");
  box.append(cellTitle(`${r.name}${flat ? "" : `[${i}]`}[${j}]`, ctx));
  if (!flat && !NO_WHO.has(r.kind))
    box.append(el("p", "explain-who", `${who(ctx, r)}: ∂loss/∂${r.of}[${i}][${j}]`));
  const f = (s) => box.append(el("p", "explain-formula", s));
  const note = (s) => box.append(el("p", "explain-note", s));
  LINES[r.kind](box, r, ctx, f, note);
  box.append(totalOrService(r.total, r.service, ctx.request.decimals));
  const before = BEFORE[r.kind] && BEFORE[r.kind](r);
  if (before)
    box.append(backButton(`${before}[${i}][${j}]`, { step: before, i: String(i), j: String(j) }));
  return box;
}
