// @ts-check
// `check_decode`'s answer drawn (docs/api.md, section 2.9): the service ran the sequence at once
// (the prefill) and a token at a time, each step with the cache the steps before it made, and
// returned `decode_check: {max_abs_diff, steps}`. The page says whether the two agree, and the
// numbers it judged from: the steps, the largest difference, and what counts as agreeing.
import { $ } from "./lib/state.js";
import { fmt } from "./lib/format.js";
import { count } from "./lib/words.js";

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
