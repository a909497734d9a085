// @ts-check
/* explain.js: how one cell of a map was computed from the step before, with the numbers.
 *
 * explainCell(ctx) returns a <section class="explain">: .explain-title ("weights[1][2] (head 0,
 * batch item 1)"), .explain-who (the query and key tokens), .explain-formula lines,
 * .explain-terms tables (the clicked cell's own term in tr.this-term), .explain-note remarks
 * (RoPE angles, fully masked rows, the sink), .explain-total ("= 0.731059 (the service:
 * 0.731059)", .explain-mismatch when the page's sum differs) and a button.explain-back whose
 * data-step, data-i, data-j name the same cell of the step before. Styles are in explorer.css.
 *
 * The arithmetic (the cell computed again from the step before) is lib/arithmetic.js's, offered
 * here too; importing this module waits for the OpenAPI document (the steps' order is its). A
 * gradient's cell (grad_*) is backward-explain.js's.
 */

import { recompute, NEG_INF, kindOf } from "./lib/arithmetic.js";
import { pairFeatures, turnedWidth } from "./lib/positions.js";
import { backButton, cellTitle, el, fmt, table, totalOrService } from "./lib/explain-parts.js";
import { LAYER_KINDS, explainLayer, layerWho, layerBefore } from "./layers/explain.js";
import { count } from "./lib/format.js";
import { isLatent, latentCell, latentExplains } from "./layers/latent.js";
import { explainGradient, isGradient } from "./backward-explain.js";
import { asRead } from "./lib/pick.js";

// the number format of the explanations (lib/explain-parts.js), as this module has always offered it
export { fmt };

// the arithmetic (lib/arithmetic.js), as this module has always offered it to its callers
export {
  explains,
  num,
  pick,
  scoreInputs,
  scoreTerms,
  softmaxRow,
  outputTerms,
  ropeOf,
  alibiOf,
  recompute,
} from "./lib/arithmetic.js";

// ALiBi's distance of key j, by where it starts (lib/arithmetic.js alibiOf)
const ALIBI_DISTANCE = {
  query: (i, j) => `p'_${j} − p_${i}`,
  zero: (i, j) => `p'_${j}`,
  last_key: (i, j) => `p'_${j} − p'_last`,
};

function alibiNote(note, a, i, j) {
  const from = {
    query: `from query ${i}`,
    zero: `from position 0 (BLOOM's and Falcon's origin)`,
    last_key: `from the last key, at p'_last = ${a.last} (MPT's origin)`,
  }[a.origin ?? "query"];
  const same =
    a.origin && a.origin !== "query"
      ? " It differs from the paper's slope · (p'_j − p_i) by a constant in each query's row, so the weights are the same."
      : "";
  note(
    `ALiBi: head ${a.head}'s slope is ${fmt(a.slope)} (of ${count(a.n, "head")}); key ${j} is at distance ${ALIBI_DISTANCE[a.origin ?? "query"](i, j)} = ${a.distance} ${from}, so the bias is ${a.symmetric ? `−${fmt(a.slope)} · |${a.distance}|` : `${fmt(a.slope)} · ${a.distance}`} = ${fmt(a.bias)}.${same}`,
  );
}

// RoPE: which pairs turned and by how much, and the query and key rows before and after.
function ropeNote(box, r, i, j) {
  const { settings: s } = r;
  box.append(
    el(
      "p",
      "explain-note",
      `RoPE (base ${s.base}, rotary_dim ${s.rotaryDim}, style "${s.style}"${s.scaling ? `, ${s.scaling.type} scaling` : ""}): feature pair n of a token at position p turns by the angle p·θ_n; query ${i} is at position ${r.qPos}, key ${j} at ${r.kPos}. Each pair (a, b) becomes (a·cos φ − b·sin φ, b·cos φ + a·sin φ).`,
    ),
  );
  if (r.scalingNote) box.append(el("p", "explain-note", r.scalingNote));
  // what the scaling (or the proportional style) did to each pair's θ, when anything did
  const said = r.scaled.some((x) => x !== "");
  box.append(
    table(
      ["pair n", "features", "θ_n", ...(said ? ["scaling"] : []), "query angle", "key angle"],
      r.theta.map((t, n) => {
        const [a, b] = pairFeatures(s.style, turnedWidth(s), n);
        const scaled = said ? [r.scaled[n]] : [];
        return [
          String(n),
          `${a} with ${b}`,
          fmt(t),
          ...scaled,
          fmt(r.qAngles[n]),
          fmt(r.kAngles[n]),
        ];
      }),
    ),
  );
  box.append(
    table(
      ["t", `${r.before[0]}[${i}][t]`, "turned", `${r.before[1]}[${j}][t]`, "turned"],
      r.qBefore.map((x, t) => [
        String(t),
        fmt(x),
        fmt(r.qRotated[t]),
        fmt(r.kBefore[t]),
        fmt(r.kRotated[t]),
      ]),
    ),
  );
}

/** The explanation of ctx's cell as an element, or null when that name is not explained. */
export function explainCell(given) {
  const ctx = asRead(given); // a config's fields as the service read them
  if (isGradient(ctx.name)) return explainGradient(ctx); // the backward's cells
  let r;
  try {
    r = latentExplains(ctx) ? latentCell(ctx) : recompute(ctx); // MLA's cells: layers/latent.js
  } catch {
    return null;
  }
  if (!r || r.total === undefined) return null;
  const { i, j } = ctx;
  const box = el("section", "explain");
  box.append(cellTitle(`${r.name}[${i}][${j}]`, ctx));
  const tokens = ctx.data.tokens,
    keys = ctx.data.context_tokens || tokens;
  if (LAYER_KINDS.has(r.kind)) {
    const who = layerWho(r, ctx);
    if (who) box.append(el("p", "explain-who", who));
  } else if (
    r.kind !== "output" &&
    Array.isArray(tokens) &&
    tokens[i] !== undefined &&
    keys &&
    keys[j] !== undefined
  ) {
    box.append(el("p", "explain-who", `query ${i} “${tokens[i]}” → key ${j} “${keys[j]}”`));
  } else if (r.kind === "output" && Array.isArray(tokens) && tokens[i] !== undefined) {
    box.append(
      el(
        "p",
        "explain-who",
        `query ${i} “${tokens[i]}”, feature ${j} of what it takes from the values`,
      ),
    );
  }
  const f = (s) => box.append(el("p", "explain-formula", s));
  const note = (s) => box.append(el("p", "explain-note", s));
  if (r.kind === "scores") {
    f(
      `scores[${i}][${j}] = Σ_t ${r.qName}[${i}][t] · ${r.kName}[${j}][t], the query row ${i} dotted with the key row ${j}`,
    );
    box.append(
      table(
        ["t", `${r.qName}[${i}][t]`, `${r.kName}[${j}][t]`, "product"],
        r.terms.map((x) => [String(x.t), fmt(x.q), fmt(x.k), fmt(x.value)]),
      ),
    );
    if (r.rope && isLatent(ctx))
      note(
        `With MLA only the last features of each head turned (q_rope, and k_rope shared by every head): click a cell of ${r.qName} or k_rope to see them.`,
      );
    else if (r.rope) ropeNote(box, r.rope, i, j);
    else if (kindOf(r.qName) === "norm") {
      note(
        r.forms.some((n) => kindOf(n) === "rotate")
          ? "qk_norm is on, after RoPE: q and k were turned, then normalised, before the dot product."
          : "qk_norm is on: q and k were normalised before the dot product.",
      );
    }
    if (r.forms.length > 2 || kindOf(r.qName) === "temper")
      note(
        `The queries went ${r.forms.join(" → ")} and the keys became ${r.kName}: click a cell of those tables to see each step.`,
      );
  } else if (r.kind === "scale") {
    f(`${r.name}[${i}][${j}] = ${r.prev}[${i}][${j}] · scale = ${fmt(r.before)} · ${fmt(r.scale)}`);
    if (typeof ctx.request.attention_multiplier === "number")
      note(
        `scale = attention_multiplier = ${fmt(ctx.request.attention_multiplier)}: Granite's own scale, in place of 1/√d_k.`,
      );
  } else if (r.kind === "softcap") {
    f(
      `${r.name}[${i}][${j}] = c · tanh(${r.prev}[${i}][${j}] / c) = ${fmt(r.cap)} · tanh(${fmt(r.before)} / ${fmt(r.cap)})`,
    );
  } else if (r.kind === "bias") {
    f(
      `${r.name}[${i}][${j}] = ${r.prev}[${i}][${j}] + position_bias[${i}][${j}] = ${fmt(r.before)} + ${fmt(r.bias)}`,
    );
    if (r.alibi) alibiNote(note, r.alibi, i, j);
    else
      note(
        r.biasFromService
          ? "The bias is the service's position_bias: T5's learned value for the bucket of the relative position p'_j − p_i."
          : "The bias is the difference of the two maps (the response carries no position_bias).",
      );
  } else if (r.kind === "t5") {
    f(
      `position_bias[${i}][${j}] = table[bucket(p'_${j} − p_${i})][head] = table[bucket(${r.distance})][${ctx.head ?? 0}]`,
    );
    note(
      "T5's buckets (exact for short distances, logarithmic bins up to max_distance) are computed by the service; the page shows its number.",
    );
  } else if (r.kind === "alibi") {
    f(
      `position_bias[${i}][${j}] = slope · (${ALIBI_DISTANCE[r.alibi.origin ?? "query"](i, j)})${r.alibi.symmetric ? ", made −|·| (symmetric)" : ""}`,
    );
    alibiNote(note, r.alibi, i, j);
  } else if (r.kind === "mask") {
    f(
      `${r.name}[${i}][${j}] = ${r.prev}[${i}][${j}] + additive mask[${i}][${j}] = ${fmt(r.before)} + ${fmt(r.entry)}`,
    );
    if (r.entry === NEG_INF)
      note("This key is masked for this query: −∞, so its weight will be 0.");
  } else if (r.kind === "softmax") {
    f(
      `${r.name}[${i}][${j}] = exp(m[${i}][${j}] − max) / Σ_k exp(m[${i}][k] − max), m = ${r.prev}`,
    );
    if (r.fullyMasked) {
      note(
        `Row ${i} is fully masked (every entry −∞): its weights are ${r.uniform ? '1/S each (fully_masked_rows: "uniform")' : "0"}.`,
      );
    } else {
      box.append(
        table(
          ["k", `m[${i}][k]`, "m − max", "exp(m − max)"],
          r.terms.map((x) => [
            String(x.k) + (x.k === j ? " ←" : ""),
            fmt(x.m),
            fmt(x.m - r.max),
            fmt(x.exp),
          ]),
          j,
        ),
      );
      if (r.sink !== null) {
        note(
          `The sink (logit ${fmt(r.sink)}) is in the max and the sum: exp(${fmt(r.sink)} − max) = ${fmt(r.sinkExp)}` +
            (r.sinkWeight !== undefined
              ? `; its weight ${fmt(r.sinkExp / r.sum)} (the service: ${fmt(r.sinkWeight)})`
              : "") +
            ".",
        );
      }
      f(
        `max = ${fmt(r.max)}, sum = ${fmt(r.sum)}, weights[${i}][${j}] = ${fmt(r.terms[j].exp)} / ${fmt(r.sum)}`,
      );
    }
  } else if (r.kind === "output") {
    const v = r.vName;
    f(
      `${r.name}[${i}][${j}] = Σ_k weights[${i}][k] · ${v}[k][${j}], the weighted sum of the ${valuesSaid(r.vForms)} rows`,
    );
    box.append(
      table(
        ["k", `weights[${i}][k]`, `${v}[k][${j}]`, "product"],
        r.terms.map((x) => [String(x.j), fmt(x.w), fmt(x.v), fmt(x.value)]),
      ),
    );
  } else if (LAYER_KINDS.has(r.kind)) explainLayer(box, r, ctx);
  box.append(totalOrService(r.lookedUp ? undefined : r.total, r.service, ctx.request.decimals));
  const before = stepBefore(r);
  // walk back one step: the page shows that cell's explanation in place of this one
  if (before)
    box.append(backButton(`${before}[${i}][${j}]`, { step: before, i: String(i), j: String(j) }));
  return box;
}

/** The map the cell was computed from, cell for cell (none for scores and output). */
function stepBefore(r) {
  if (SCORES_READ.has(r.kind)) return r.prev;
  if (LAYER_KINDS.has(r.kind)) return layerBefore(r);
  return null;
}

// the kinds of step whose cell reads the same cell of the scores before it
const SCORES_READ = new Set(["scale", "softcap", "bias", "mask", "softmax"]);

// what a kind of step did to the values, in words
const DONE_TO_V = { clip: "clipped", norm: "normalised" };

/** The values the output read, in words: "V", or what the steps did to them ("clipped V",
 * "clipped and normalised V"), from the forms V took (the projection first). */
function valuesSaid(forms) {
  const done = forms.slice(1).map((n) => DONE_TO_V[kindOf(n)] ?? n);
  return done.length ? `${done.join(" and ")} V` : "V";
}
