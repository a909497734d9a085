// @ts-check
// The answer's verdicts drawn. "Compare with my numbers": the warnings (also under their
// fields), the comparison in step order with the diagnosis of the first difference, and a
// difference map (yours − ours) of each compared output, its largest difference outlined (the
// boxes and the Compare action: compare.js). And `check_decode`'s (docs/api.md, section 2.9):
// the service ran the sequence at once (the prefill) and a token at a time, each step with the
// cache the steps before it made, and returned `decode_check: {max_abs_diff, steps}`; the page
// says whether the two agree, and the numbers it judged from.
import { $, button } from "./lib/state.js";
import { fmt, count } from "./lib/format.js";
import { maskedFloor } from "./lib/schema.js";
import { nullIsNegInf, shapeOf } from "./lib/paste.js";
import { heatmap } from "./heatmap.js";
import { formFieldFor } from "./errors.js";

/** The API's name of a drawn output's label: heads.0.weights → weights. */
export const apiName = (label) => label.split(".").pop();

// Opens the folds (a head's tables, a folded map) that hold `el`, so that it can be seen.
export function reveal(el) {
  for (
    let d = el.parentElement && el.parentElement.closest("details");
    d;
    d = d.parentElement && d.parentElement.closest("details")
  )
    d.open = true;
}

const number = (v) => (v === null || v === undefined ? "—" : fmt(v));

// The precision an entry was compared at when your numbers were printed ("the 4 decimals you
// printed") or judged at a low precision ("bfloat16 rounding": within twice a bfloat16
// computation's error), or null (compared with the tolerance).
export function comparedAtWords(entry) {
  if (entry.precision) return `${entry.precision.type} rounding`;
  const p = entry.printed;
  if (!p) return null;
  return "decimals" in p
    ? `the ${count(p.decimals, "decimal")} you printed`
    : `the ${count(p.significant, "significant digit")} you printed`;
}

// yours − ours, cell by cell; null where the difference is not a number (hatched)
export function differenceMap(name, yours, ours) {
  const nullYours = nullIsNegInf(name) ? -Infinity : NaN;
  const floor = maskedFloor(); // a score at or below it counts as masked (masked_fill(-1e9))
  const real = (v, nullIs) =>
    v === null || v === undefined ? nullIs : typeof v === "boolean" ? Number(v) : v;
  return ours.map((row, i) =>
    row.map((o, j) => {
      const y = real(yours[i] && yours[i][j], nullYours);
      const x = real(o, -Infinity); // the response's null is a masked (−∞) score
      if ((Number.isNaN(x) && Number.isNaN(y)) || (x === y && !Number.isFinite(x))) return 0;
      if (x === -Infinity && y <= floor) return 0;
      if (!Number.isFinite(x) || !Number.isFinite(y)) return null;
      return y - x;
    }),
  );
}

function outline(fig, cell) {
  const [i, j] = cell;
  fig.dataset.where = `${i},${j}`;
  const rect = fig.querySelector(`rect.cell[data-row="${i}"][data-col="${j}"]`);
  if (rect) {
    rect.classList.add("where");
    const ring = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    for (const a of ["x", "y", "width", "height"]) ring.setAttribute(a, rect.getAttribute(a));
    ring.setAttribute("class", "where-outline");
    ring.setAttribute("fill", "none");
    ring.setAttribute("stroke", "#111");
    ring.setAttribute("stroke-width", "3");
    ring.setAttribute("pointer-events", "none");
    rect.ownerSVGElement.append(ring);
    return;
  }
  if (fig.markCell) fig.markCell(i, j); // a canvas map: outlined and brought into view
}

// The index within the drawn matrix of `where`, or null when it is in another batch item.
function cellOf(where, batched, b) {
  if (!Array.isArray(where) || where.length < 2) return null;
  if (where.length === 2) return where;
  if (batched && where.length === 3 && where[0] === b) return where.slice(1);
  return null;
}

/** The difference map of a compared output (`item`, as drawn; `entry`, its row of the comparison),
 * or null when `yours` is not of the drawn matrix's shape. */
export function diffFigure(item, entry, yours, ours, ctx) {
  const shown = ctx.batched && shapeOf(yours).length === 3 ? yours[ctx.batch] : yours;
  if (!Array.isArray(shown) || shapeOf(shown).join() !== shapeOf(ours).join()) return null;
  const m = differenceMap(apiName(item.label), shown, ours);
  const cols = item.cols || Array.from({ length: ours[0].length }, (_, j) => String(j));
  const rows =
    item.rows && item.rows.length === ours.length
      ? item.rows
      : Array.from({ length: ours.length }, (_, i) => String(i));
  const title = `${item.label}: yours − ours`;
  const fig = heatmap(`diff_${item.key}`, title, m, rows, cols, "scores", null, null, item.axes); // the compared array's own axes
  fig.classList.add("diff", entry.match ? "ok" : "bad");
  fig.dataset.compared = item.label;
  const note = document.createElement("p");
  note.className = "hint";
  const printed = comparedAtWords(entry);
  const verdict = entry.match ? (printed ? `✓ agrees to ${printed}` : "✓ matches") : "✗ differs";
  note.textContent = `${verdict}: largest |yours − ours| ${entry.max_abs_diff === null ? "∞ (one side not finite)" : fmt(entry.max_abs_diff)} at [${entry.where.join(", ")}] (outlined). Red: yours is lower; blue: higher; hatched: not comparable (one side −∞ or NaN).`;
  fig.querySelector("figcaption").after(note);
  const cell = cellOf(entry.where, ctx.batched, ctx.batch);
  if (cell) outline(fig, cell);
  return fig;
}

export function warningsPanel(data) {
  const box = $("warnings");
  document.querySelectorAll(".field-warning").forEach((el) => el.remove());
  const list = Array.isArray(data.warnings) ? data.warnings : [];
  box.hidden = !list.length;
  box.replaceChildren();
  if (!list.length) return;
  const h = document.createElement("h2");
  h.textContent = list.length === 1 ? "Warning" : `Warnings (${list.length})`;
  const ul = document.createElement("ul");
  for (const w of list) {
    const li = document.createElement("li");
    li.dataset.code = w.code;
    const code = document.createElement("code");
    code.textContent = w.code;
    li.append("⚠ ", code, ` (${w.field}): ${w.message}`);
    ul.append(li);
    const field = formFieldFor(w.field);
    if (field) {
      const p = document.createElement("p");
      p.className = "field-warning";
      p.textContent = `⚠ ${w.message}`;
      field.append(p);
    }
  }
  box.append(h, ul);
}

// `dropped`: the `decimals` the last Compare left out of the request (said above the list).
export function comparisonPanel(data, cards, dropped) {
  const panel = $("comparison");
  const rows = Array.isArray(data.comparison) ? data.comparison : null;
  panel.hidden = !rows;
  panel.replaceChildren();
  if (!rows) return;
  const h = document.createElement("h2");
  h.textContent = "Your numbers against the service's";
  panel.append(h);
  const first = rows.find((r) => r.name === data.first_mismatch);
  const verdict = document.createElement("div");
  verdict.className = "verdict";
  if (!first) {
    verdict.classList.add("ok");
    const printed = rows.map(comparedAtWords).filter((w) => w);
    const how = printed.length ? ` (${[...new Set(printed)].join(", ")})` : " within the tolerance";
    const all =
      rows.length === 1
        ? "The compared array matches"
        : `All ${count(rows.length, "compared array")} match`;
    verdict.textContent = `✓ ${all}${how}.`;
  } else if (first.diagnosis) {
    verdict.classList.add("diagnosis");
    const lead = document.createElement("p");
    lead.append(`Diagnosis for ${first.name}: `);
    first.diagnosis.mistakes.forEach((code, i) => {
      if (i) lead.append(" + ");
      const c = document.createElement("code");
      c.className = "mistake";
      c.textContent = code;
      lead.append(c);
    });
    const why = document.createElement("p");
    why.className = "explanation";
    why.textContent = first.diagnosis.explanation;
    verdict.append(lead, why);
    const others = first.diagnosis.alternatives || [];
    if (others.length) {
      // sets that reproduce the numbers as closely (the explanation says why both fit)
      const also = document.createElement("p");
      also.className = "alternatives";
      also.append("Reproduced as closely by: ");
      others.forEach((codes, i) => {
        if (i) also.append("; or ");
        codes.forEach((code, j) => {
          if (j) also.append(" + ");
          const c = document.createElement("code");
          c.className = "mistake";
          c.textContent = code;
          also.append(c);
        });
      });
      verdict.append(also);
    }
  } else {
    verdict.classList.add("none");
    const lead = document.createElement("p");
    lead.textContent = `No listed mistake (alone or in pairs) reproduces your numbers in ${first.name}.`;
    const why = document.createElement("p");
    why.className = "explanation";
    why.textContent = first.message;
    verdict.append(lead, why);
  }
  panel.append(verdict);
  if (dropped !== undefined) {
    const note = document.createElement("p");
    note.className = "hint";
    note.textContent = `Compared at full precision: "decimals": ${JSON.stringify(dropped)} was left out of this request, so every number below is unrounded.`;
    panel.append(note);
  }
  const ol = document.createElement("ol");
  ol.className = "compared";
  for (const r of rows) {
    const li = document.createElement("li");
    li.dataset.name = r.name;
    li.className = r.match ? "ok" : "bad";
    if (r.name === data.first_mismatch) li.classList.add("first-mismatch");
    const mark = document.createElement("span");
    mark.className = "mark";
    mark.textContent = r.match ? "✓" : "✗";
    mark.setAttribute("aria-label", r.match ? "matches" : "differs");
    const name = document.createElement("code");
    name.textContent = r.name;
    const diff = r.max_abs_diff === null ? "∞" : fmt(r.max_abs_diff);
    li.append(
      mark,
      " ",
      name,
      ` max |diff| ${diff} at [${r.where.join(", ")}] (yours ${number(r.yours)}, ours ${number(r.ours)})`,
    );
    const printed = comparedAtWords(r);
    if (printed) li.append(r.match ? ` — agrees to ${printed}` : ` — compared at ${printed}`);
    if (r.name === data.first_mismatch) li.append(" — first difference");
    const card = cards.get(r.name);
    if (card) {
      const show = button("show", () => {
        reveal(card);
        card.scrollIntoView({ block: "center" });
        card.classList.add("flash");
        setTimeout(() => card.classList.remove("flash"), 1200);
      });
      show.className = "secondary";
      show.setAttribute("aria-label", `Show ${r.name}`);
      li.append(" ", show);
    }
    li.title = r.message;
    ol.append(li);
  }
  panel.append(ol);
}

// ---- check_decode ---------------------------------------------------------------------------------

// Without `decimals`, a difference this small against the output's largest |value| (at least 1)
// is float rounding: the same bound as a cell's explanation (lib/explain-parts.js, totalLine).
export const ROUNDING = 1e-9;

/** The largest |value| of a nested array of numbers (0 when it holds none). */
function largest(a) {
  if (typeof a === "number") return Math.abs(a);
  return Array.isArray(a) ? a.reduce((m, x) => Math.max(m, largest(x)), 0) : 0;
}

/** The shape of a nested array ([] for a number). */
function shape(a) {
  const dims = [];
  for (let x = a; Array.isArray(x); x = x[0]) dims.push(x.length);
  return dims;
}

/** Whether the request's masks keep every query from the keys after it (a causal mask, a window
 * with nothing to the right, chunks): without that the prefill sees what a decode step cannot. */
function keepsToThePast(body) {
  const masks = body.mask === undefined ? [] : [].concat(body.mask);
  return masks.some(
    (m) =>
      m && (m.type === "causal" || m.type === "chunked" || (m.type === "window" && m.right === 0)),
  );
}

/** The verdict: {ok, text, bound} for `check` ({max_abs_diff, steps}) of the request `body`
 * answered with `data`. */
export function decodeVerdict(check, body, data) {
  const diff = check.max_abs_diff;
  const decimals = Number.isInteger(body.decimals) ? body.decimals : null;
  const scale = Math.max(1, largest(data.output));
  const ok =
    typeof diff === "number" && (decimals !== null ? diff === 0 : diff <= ROUNDING * scale);
  const bound =
    decimals !== null
      ? `it rounds to 0 at the answer's ${count(decimals, "decimal")}`
      : `≤ ${ROUNDING} × ${fmt(scale)}, float rounding (${ROUNDING} × the output's largest |value|, at least 1)`;
  const how = "Decoded a token at a time, each step with the cache the steps before it made,";
  let text;
  if (ok)
    text =
      decimals !== null
        ? `✓ ${how} the layer gives the output it gives the whole sequence at once, to the answer's ${count(decimals, "decimal")}.`
        : `✓ ${how} the layer gives the output it gives the whole sequence at once: they differ by ${fmt(diff)}, float rounding.`;
  else {
    text = `✗ ${how} the layer does not give the output it gives the whole sequence at once: they differ by up to ${diff === null ? "∞" : fmt(diff)}.`;
    if (!keepsToThePast(body))
      text +=
        " The request has no causal mask: at once, each token sees the tokens after it, which a decode step has not made yet (a decoder's request needs its causal mask).";
  }
  return { ok, text, bound };
}

// A term and its value (marked data-value=`key`), then what the value is.
function pair(list, term, value, key, about = "") {
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  const v = document.createElement("span");
  v.dataset.value = key;
  v.textContent = value;
  dd.append(v, about && ` ${about}`);
  list.append(dt, dd);
}

/** The panel of `decode_check` (hidden when the answer has none); a whenDrawn hook. */
export function drawDecodeCheck({ data, body }) {
  const box = $("decode-check");
  const check = data && data.decode_check;
  box.hidden = !check;
  box.replaceChildren();
  if (!check) return;
  const h = document.createElement("h2");
  h.textContent = "A token at a time against the whole sequence at once (check_decode)";
  const { ok, text, bound } = decodeVerdict(check, body, data);
  const verdict = document.createElement("p");
  verdict.className = `verdict ${ok ? "ok" : "bad"}`;
  verdict.textContent = text;
  const list = document.createElement("dl");
  list.className = "decode-numbers";
  pair(list, "steps", String(check.steps), "steps", "(the tokens, decoded one at a time)");
  const diff = check.max_abs_diff === null ? "∞" : fmt(check.max_abs_diff);
  const over = "(the largest |a token at a time − at once| over the output)";
  pair(list, "max_abs_diff", diff, "max_abs_diff", over);
  const dims = shape(data.output);
  if (dims.length) pair(list, "output", `[${dims.join(" × ")}]`, "output", "(under Matrices)");
  pair(list, "agrees when", bound, "bound");
  box.append(h, verdict, list);
}
