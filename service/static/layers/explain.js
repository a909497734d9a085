// @ts-check
// The explanations of the cells of today's layers (explain.js calls these for the kinds
// lib/layers.js computes, the kinds of x-chain's steps): a cell of a step of kind clip (the
// number and the clamp's bounds), norm (the vector's RMS or mean and variance, eps, the weight
// w or 1 + w), rotate (the feature's pair, its θ and what the scaling did to every pair's θ, the
// angle), temper (the temperature at the query's position, with the floor and the log), and
// /multihead's gate (the sigmoid of x's row dotted with W_g's row) and gated (concat · gate);
// and DeepSeek's MLA (layers/latent.js): c_q and
// c_kv (the latent row, its RMSNorm and weight), k_rope and q_rope (RoPE of the rope features in
// DeepSeek's layout), the heads' [nope | rope] queries and keys. Each adds its lines to the
// explanation `box`; explain.js adds the total beside the service's number and the way back.
import { el, fmt, table } from "../lib/explain-parts.js";
import { count } from "../lib/format.js";
import { layerNames, slotOf } from "../lib/layers.js";

export const LAYER_KINDS = new Set([
  "clip",
  "norm",
  "rotate",
  "temper",
  "gate",
  "gated",
  "latent-norm",
  "latent-rope",
  "latent-pass",
]);

/** The cell the explained one was computed from, cell for cell, or null: a "how … was
 * computed" button walks back to a form that is one of today's layers (lib/layers.js), not to a
 * projection or MLA's parts. */
export function layerBefore(r) {
  const from = r.kind === "gated" ? "gate" : r.from;
  return layerNames().has(from) ? from : null;
}

/** Whose vector the cell belongs to: "query 2 “cat”, feature 1", or null without tokens. */
export function layerWho(r, ctx) {
  const { i, j, name } = ctx;
  const side = slotOf(name) ?? r.side; // MLA's parts say their side
  const keys = side === "k" || side === "v" || name === "c_kv";
  const labels = keys ? ctx.data.context_tokens || ctx.data.tokens : ctx.data.tokens;
  const token = Array.isArray(labels) && labels[i] !== undefined ? ` “${labels[i]}”` : "";
  const row = `${keys ? "key" : "query"} ${i}${token}`;
  if (r.kind === "gate" || r.kind === "gated") {
    const dv = Number(ctx.data.d_v);
    const head = dv > 0 ? ` (head ${Math.floor(j / dv)}'s feature ${j % dv})` : "";
    return `${row}, feature ${j} of the heads' concat${head}`;
  }
  return `${row}, feature ${j}`;
}

/** The lines of r's explanation, added to `box`. */
export function explainLayer(box, r, ctx) {
  const f = (s) => box.append(el("p", "explain-formula", s));
  const note = (s) => box.append(el("p", "explain-note", s));
  const { i, j, name } = ctx;
  if (r.kind === "norm") normLines(box, r, name, i, j, f, note);
  else if (r.kind.startsWith("latent-")) latentLines(box, r, ctx, f, note);
  else if (r.kind === "rotate") rotateLines(box, r, name, i, j, f, note);
  else if (r.kind === "clip") {
    f(`${name}[${i}][${j}] = min(max(${r.from}[${i}][${j}], −c), c), c = clip_qkv = ${fmt(r.c)}`);
    f(`= min(max(${fmt(r.before)}, ${fmt(-r.c)}), ${fmt(r.c)})`);
    note(
      Math.abs(r.before) > r.c
        ? `${fmt(r.before)} lies beyond ±${fmt(r.c)}, so the clamp sets it to ${fmt(r.total)}: OLMo clamps every number of q, k and v right after the projections.`
        : `${fmt(r.before)} lies within ±${fmt(r.c)}, so the clamp leaves it: OLMo clamps every number of q, k and v right after the projections.`,
    );
  } else if (r.kind === "temper") {
    const plus = r.shift === 0 ? "p" : `p + ${r.shift}`;
    const who =
      r.shift === 0
        ? "Ministral 3's query scale (every layer, after RoPE)"
        : "Llama 4's temperature (its layers without RoPE)";
    f(
      `${name}[${i}][${j}] = ${r.from}[${i}][${j}] · τ(p), τ(p) = log(⌊(${plus})/floor_scale⌋ + 1) · attn_scale + 1`,
    );
    f(
      `query ${i} is at position p = ${r.p}: (${plus})/floor_scale = ${r.p + r.shift}/${fmt(r.floor)} = ${fmt(r.ratio)}; ⌊${fmt(r.ratio)}⌋ = ${r.steps}; log(${r.steps} + 1) = ${fmt(r.log)}; τ = ${fmt(r.log)} · ${fmt(r.slope)} + 1 = ${fmt(r.factor)}`,
    );
    f(`${name}[${i}][${j}] = ${fmt(r.before)} · ${fmt(r.factor)}`);
    note(
      r.steps === 0
        ? `${who}: below position floor_scale − ${r.shift} = ${fmt(r.floor - r.shift)} the floor is 0 and τ = 1, so the query is unchanged.`
        : `${who}: the factor steps up once every floor_scale positions, by the log of the count, so queries further along score more sharply.`,
    );
  } else if (r.kind === "gate") {
    const b = r.bias === null ? "" : ` + b_g[${j}]`;
    f(
      `gate[${i}][${j}] = sigmoid(z) = 1 / (1 + exp(−z)), z = Σ_t ${r.xName}[${i}][t] · W_g[${j}][t]${b}`,
    );
    box.append(
      table(
        ["t", `${r.xName}[${i}][t]`, `W_g[${j}][t]`, "product"],
        r.terms.map((x) => [String(x.t), fmt(x.x), fmt(x.w), fmt(x.value)]),
      ),
    );
    f(
      `z = ${fmt(r.dot)}${r.bias === null ? "" : ` + ${fmt(r.bias)} = ${fmt(r.z)}`}; exp(−z) = ${fmt(r.e)}; gate = 1 / (1 + ${fmt(r.e)})`,
    );
    note(
      r.source === "gate"
        ? `W_g[${j}] is row ${j} of the request's gate.w (out_in): Qwen3-Next's output gate, one per feature of the concat.`
        : `W_g[${j}] is row ${r.sourceRow} of q_proj.weight (gate: true): Qwen3-Next stores each head's query rows, then its gate rows.`,
    );
  } else if (r.kind === "gated") {
    f(
      `${name}[${i}][${j}] = ${r.from}[${i}][${j}] · gate[${i}][${j}] = ${fmt(r.concat)} · ${fmt(r.gate)}`,
    );
    note("The gated concat, not the concat, goes through W_o: projected = gated · W_o.");
  }
}

/** Where a weight's or bias's entry for feature `at` of the norm's vector (feature j of the head)
 * is in the request: q_norm.weight[5], q_norm.weight[1][1] (a row per head), or w[j] shared. */
function entryName(e, j, at) {
  if (e.perHead) return `${e.key}[${e.row}][${j}]`;
  return `${e.key}[${e.shared ? j : at}]`;
}

function normLines(box, r, name, i, j, f, note) {
  const projection = r.over === "projection";
  const at = r.at ?? j; // feature j of the head within the vector the norm spans
  const x = projection ? "x" : `${r.from}[${i}]`;
  const w = r.factor === null ? "" : r.zeroCentered ? ` · (1 + w[${at}])` : ` · w[${at}]`;
  const b = r.b === null || r.b === undefined ? "" : ` + b[${at}]`;
  if (projection) {
    const who = r.side === "q" ? "query" : "key";
    const heads = r.heads.map((hh) => `${r.from}[${i}] of head ${hh}`).join(", ");
    f(
      `x = ${who} ${i}'s whole projection, every head's ${r.from}[${i}] side by side (${count(r.terms.length, "feature")}: ${heads}); feature ${j} of this head is x[${at}]`,
    );
  }
  if (r.type === "rms") f(`${name}[${i}][${j}] = ${x}[${at}] / √(mean_u ${x}[u]² + eps)${w}${b}`);
  else f(`${name}[${i}][${j}] = (${x}[${at}] − mean) / √(mean_u (${x}[u] − mean)² + eps)${w}${b}`);
  const rms = r.type === "rms";
  const cells = (t) =>
    rms ? [String(t.t), fmt(t.x), fmt(t.sq)] : [String(t.t), fmt(t.x), fmt(t.c), fmt(t.sq)];
  const dk = r.dk ?? r.terms.length;
  const head = (t) => (projection ? [`${r.heads[Math.floor(t.t / dk)]}, ${t.t % dk}`] : []);
  box.append(
    table(
      [
        "u",
        ...(projection ? ["head, feature"] : []),
        `${x}[u]`,
        ...(rms ? [] : ["− mean"]),
        "square",
      ],
      r.terms.map((t) => {
        const [u, ...rest] = cells(t);
        return [u, ...head(t), ...rest];
      }),
      at,
    ),
  );
  const spread = rms ? "mean of the squares" : `mean = ${fmt(r.mean)}, variance`;
  const over = projection ? ` (over all ${count(r.terms.length, "feature")})` : "";
  f(
    `${spread}${over} = ${fmt(r.spread)}; √(${fmt(r.spread)} + ${fmt(r.eps)}) = ${fmt(r.denom)}; ${fmt(r.terms[at].c)} / ${fmt(r.denom)} = ${fmt(r.normed)}`,
  );
  const scaled = r.factor === null ? r.normed : r.normed * r.factor;
  if (r.factor !== null)
    f(
      r.zeroCentered
        ? `· (1 + w[${at}]) = 1 + ${fmt(r.w)} = ${fmt(r.factor)} (zero-centred weights, as Qwen3-Next stores them): ${fmt(r.normed)} · ${fmt(r.factor)}`
        : `· w[${at}] = ${fmt(r.factor)}: ${fmt(r.normed)} · ${fmt(r.factor)}`,
    );
  if (b) f(`+ b[${at}] = ${fmt(r.b)}: ${fmt(scaled)} + ${fmt(r.b)}`);
  const sources = [];
  if (r.weightEntry && r.factor !== null)
    sources.push(`w[${at}] is ${entryName(r.weightEntry, j, at)}`);
  if (r.biasEntry && b) sources.push(`b[${at}] is ${entryName(r.biasEntry, j, at)}`);
  if (r.epsField && r.epsField.startsWith("config.")) sources.push(`eps is ${r.epsField}`);
  if (sources.length)
    note(
      `${sources.join("; ")}${r.weightEntry && r.weightEntry.perHead ? ` (the row of head ${r.weightEntry.row}: a weight per head, as Cohere's and StableLM's)` : ""}.`,
    );
  if (projection)
    note(
      `qk_norm over the projection (OLMo 2, OLMo 3, OLMoE): one norm spans all of the token's ${r.side === "q" ? "query heads" : "key heads"}' features, taken before the head split, so every head's numbers share this token's denominator.`,
    );
  if (r.kind === "norm" && r.side === "v")
    note(
      `v_norm (Gemma 4): each value vector over its d_v features, no weight; the output is weights · ${name}.`,
    );
  else if (r.afterRope)
    note(
      `qk_norm after RoPE (Llama 4's L2 norm): it normalises the rotated vector ${r.from}[${i}], not the projection.`,
    );
}

function rotateLines(box, r, name, i, j, f, note) {
  const { settings: s } = r;
  const who = r.side === "q" ? "query" : "key";
  const x = `${r.from}[${i}]`;
  note(
    `RoPE (base ${s.base}, rotary_dim ${s.rotaryDim}, style "${s.style}"${s.scaling ? `, ${s.scaling.type} scaling` : ""}): ${who} ${i} is at position p = ${r.pos}; feature pair n turns by the angle p·θ_n.`,
  );
  if (r.pair < 0) {
    f(
      `${name}[${i}][${j}] = ${x}[${j}]: feature ${j} is past the turned ${count(r.pairs.length * 2, "feature")}, so RoPE leaves it`,
    );
  } else {
    const { f: a, g: b } = r;
    const gain = r.gain === 1 ? "" : ` (cos and sin × ${fmt(r.gain)})`;
    f(
      r.first
        ? `${name}[${i}][${j}] = ${x}[${a}] · cos φ − ${x}[${b}] · sin φ, pair ${r.pair} (features ${a} with ${b})${gain}`
        : `${name}[${i}][${j}] = ${x}[${b}] · cos φ + ${x}[${a}] · sin φ, pair ${r.pair} (features ${a} with ${b})${gain}`,
    );
    f(
      `φ = ${r.at === r.pos ? "p" : `p/${fmt(s.scaling.factor)} (linear scaling)`} · θ_${r.pair} = ${fmt(r.at)} · ${fmt(r.theta[r.pair])} = ${fmt(r.phi)}; cos φ${gain ? " · gain" : ""} = ${fmt(r.c)}, sin φ${gain ? " · gain" : ""} = ${fmt(r.s)}`,
    );
    f(
      r.first
        ? `= ${fmt(r.a)} · ${fmt(r.c)} − ${fmt(r.b)} · ${fmt(r.s)}`
        : `= ${fmt(r.b)} · ${fmt(r.c)} + ${fmt(r.a)} · ${fmt(r.s)}`,
    );
  }
  if (r.scalingNote) note(r.scalingNote);
  const said = r.scaled.some((w) => w !== "");
  box.append(
    table(
      ["pair n", "features", "θ_n", ...(said ? ["scaling"] : []), `angle at p = ${r.pos}`],
      r.theta.map((t, n) => [
        String(n),
        `${r.pairs[n][0]} with ${r.pairs[n][1]}`,
        fmt(t),
        ...(said ? [r.scaled[n]] : []),
        fmt(r.angles[n]),
      ]),
      r.pair,
    ),
  );
}

// ---- DeepSeek's multi-head latent attention (layers/latent.js)

function latentLines(box, r, ctx, f, note) {
  const { i, j, name } = ctx;
  if (r.kind === "latent-pass") {
    f(
      `${name}[${i}][${j}] = ${r.from}[${i}][${j}]: the head's first ${count(r.nope, "feature")}, which RoPE leaves`,
    );
    note(
      `With MLA the heads' ${name} is [${r.from} | ${name[0]}_rope]: click a cell of ${name[0]}_rope for the turned features.`,
    );
    return;
  }
  if (r.kind === "latent-norm") {
    const w = name === "c_q" ? "W_qa" : "W_kva";
    const b = r.dotJ.bias === null ? "" : ` + b[${j}]`;
    f(
      `z = x[${i}] ${w}ᵀ${r.dotJ.bias === null ? "" : " + b"} (${r.proj}.weight${r.ropePart ? `, its first ${r.latent.length} rows` : ""}); z[${j}] = Σ_t x[${i}][t] · ${w}[${j}][t]${b}`,
    );
    box.append(
      table(
        ["t", `x[${i}][t]`, `${w}[${j}][t]`, "product"],
        r.dotJ.terms.map((x) => [String(x.t), fmt(x.x), fmt(x.w), fmt(x.value)]),
      ),
    );
    f(
      `z[${j}] = ${fmt(r.dotJ.dot)}${r.dotJ.bias === null ? "" : ` + ${fmt(r.dotJ.bias)} = ${fmt(r.dotJ.value)}`}`,
    );
    normLines(box, { ...r, from: "z" }, name, i, j, f, note);
    note(`RMSNorm with ${r.norm}.weight (w), eps = ${fmt(r.eps)}.`);
    if (r.ropePart) {
      const cache = ctx.data.mla_cache_numbers;
      note(
        `The other ${count(r.ropePart.length, "feature")} of x[${i}] W_kvaᵀ are k_pe = [${r.ropePart.map((x) => fmt(x)).join(", ")}], turned into k_rope. A cache holds c_kv and k_rope${cache ? `: ${count(cache, "number")} a token` : ""}; every head's k_nope and V are c_kv W_kvbᵀ (kv_b_proj).`,
      );
    } else
      note("Every head's queries are c_q W_qbᵀ (q_b_proj): q_nope, then the features RoPE turns.");
    return;
  }
  // latent-rope: RoPE of the rope features
  const { settings: s } = r;
  const who = r.side === "q" ? "query" : "key";
  const source =
    r.side === "k"
      ? `the last ${count(r.pe.length, "feature")} of x[${i}] W_kvaᵀ (kv_a_proj_with_mqa), one key for every head`
      : `head ${r.head}'s last ${count(r.pe.length, "feature")} of ${ctx.data.c_q ? `c_q[${i}] W_qbᵀ (q_b_proj)` : `x[${i}] W_qᵀ (q_proj)`}`;
  f(`${r.from} = ${source} = [${r.pe.map((x) => fmt(x)).join(", ")}]`);
  if (r.held)
    note(
      `The service's ${r.side} before RoPE holds the same: [${r.held.map((x) => fmt(x)).join(", ")}].`,
    );
  note(
    `RoPE (base ${s.base}, over the ${count(r.pe.length, "rope feature")}, style "${s.style}"${s.scaling ? `, ${s.scaling.type} scaling` : ""}): ${who} ${i} is at position p = ${r.pos}; pair n turns by p·θ_n.` +
      (s.style === "interleaved"
        ? ` DeepSeek's interleaved layout: pair n is features (2n, 2n + 1) of ${r.from}, and comes out as features n and n + ${r.pe.length / 2} (the pairs' first members, then their second members).`
        : ""),
  );
  const out = name.endsWith("_rope")
    ? `${name}[${i}][${j}]`
    : `${name}[${i}][${j}] = ${r.side}_rope[${i}][${r.t}]`;
  const gain = r.gain === 1 ? "" : ` (cos and sin × ${fmt(r.gain)})`;
  f(
    r.first
      ? `${out} = ${r.from}[${r.f}] · cos φ − ${r.from}[${r.g}] · sin φ, the first member of pair ${r.pair}${gain}`
      : `${out} = ${r.from}[${r.g}] · cos φ + ${r.from}[${r.f}] · sin φ, the second member of pair ${r.pair}${gain}`,
  );
  f(
    `φ = ${r.at === r.pos ? "p" : `p/${fmt(s.scaling.factor)} (linear scaling)`} · θ_${r.pair} = ${fmt(r.at)} · ${fmt(r.theta[r.pair])} = ${fmt(r.phi)}; cos φ${gain ? " · gain" : ""} = ${fmt(r.c)}, sin φ${gain ? " · gain" : ""} = ${fmt(r.s)}`,
  );
  f(
    r.first
      ? `= ${fmt(r.a)} · ${fmt(r.c)} − ${fmt(r.b)} · ${fmt(r.s)}`
      : `= ${fmt(r.b)} · ${fmt(r.c)} + ${fmt(r.a)} · ${fmt(r.s)}`,
  );
  if (r.scalingNote) note(r.scalingNote);
  const said = r.scaled.some((w) => w !== "");
  const half = r.pe.length / 2;
  box.append(
    table(
      [
        "pair n",
        `features of ${r.from}`,
        "θ_n",
        ...(said ? ["scaling"] : []),
        `angle at p = ${r.pos}`,
        `into ${r.side}_rope`,
      ],
      r.theta.map((t, n) => [
        String(n),
        s.style === "interleaved" ? `${2 * n} with ${2 * n + 1}` : `${n} with ${n + half}`,
        fmt(t),
        ...(said ? [r.scaled[n]] : []),
        fmt(r.angles[n]),
        `${n} and ${n + half}`,
      ]),
      r.pair,
    ),
  );
}
