// @ts-check
// The backward asked for from the form (API "The backward pass, every step"; docs/api.md 2.13):
// grad_output, dO = ∂loss/∂(the answer's last array: `output` on /attention and /mask, the
// block's last array on /multihead, which the answer's top-level `output` also is). Four choices:
//   off       the forward only (the page opens so);
//   pattern   the page's default: dO[b][i][c] = ((3i + 5c + 2b) mod 7 − 3) / 4, numbers from
//             −0.75 to 0.75 (exact in binary) that differ along every row. Not "sum": after a
//             layer norm with γ = 1 a dO whose rows are constant gives every gradient 0;
//   sum       "sum": loss = the sum of the array, every dO 1 (out.sum().backward());
//   mine      an array typed or pasted in the box, read like the other boxes (lib/fields.js).
// The pattern needs the last array's shape: the shape of the answer to the same request (the
// body without grad_output) when one came back, else one request first with include
// ["output"] (run.js: patternFor).
import { $, FieldError } from "./lib/state.js";
import { formatMatrix, isMatrix, isStack } from "./lib/format.js";
import { parseMatrix } from "./lib/fields.js";

/** dO of the pattern at batch item b, row i, feature c. */
export const patternValue = (b, i, c) => ((((3 * i + 5 * c + 2 * b) % 7) + 7) % 7) / 4 - 0.75;

/** The pattern shaped `shape` ([L, d] or [B, L, d]). */
export function pattern(shape) {
  const rows = (b, L, d) =>
    Array.from({ length: L }, (_, i) => Array.from({ length: d }, (_, c) => patternValue(b, i, c)));
  return shape.length === 3
    ? Array.from({ length: shape[0] }, (_, b) => rows(b, shape[1], shape[2]))
    : rows(0, shape[0], shape[1]);
}

/** The shape of the answer's last array (its top-level `output`), or undefined. */
export function lastShape(data) {
  const o = data && data.output;
  if (isStack(o)) return [o.length, o[0].length, o[0][0].length];
  if (isMatrix(o)) return [o.length, o[0].length];
  return undefined;
}

// the shape of the last array of each request answered, by the request without grad_output
const shapes = new Map();
const keyOf = (body) => {
  const { grad_output: _, ...rest } = body;
  return JSON.stringify(rest);
};

/** Keep the shape of `data`'s last array for requests like `body` (run.js, on each answer). */
export function rememberShape(body, data) {
  const shape = lastShape(data);
  if (shape) shapes.set(keyOf(body), shape);
}

const mode = () => $("grad_mode").value;

/** Whether the form asks for the pattern and `body` has no grad_output yet (its shape unknown). */
export const patternPending = (body) => mode() === "pattern" && body.grad_output === undefined;

/** grad_output into `body` (request.js, once every other field is in): "sum", the box's array,
 * or the pattern when the last array's shape is known for this request. */
export function gradBody(body) {
  const m = mode();
  if (!m) return;
  if (m === "sum") body.grad_output = "sum";
  else if (m === "mine") {
    const given = parseMatrix("grad_output");
    if (given === undefined)
      throw new FieldError(
        "grad_output",
        "grad_output: paste dO, shaped as the answer's last array, or pick the pattern or “sum”",
      );
    body.grad_output = given;
  } else if (m === "pattern" && body.grad_output === undefined) {
    const shape = shapes.get(keyOf(body));
    if (shape) body.grad_output = pattern(shape);
  }
}

/** The pattern for `body` on endpoint `ep`, its shape asked for first (the forward alone, only
 * `output` returned); undefined when that request fails (the Run then shows the service's own
 * error for the forward). */
export async function patternFor(ep, body) {
  const { grad_output: _, ...forward } = body;
  try {
    const r = await fetch(ep, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...forward, include: ["output"] }),
    });
    if (!r.ok) return undefined;
    const shape = lastShape(await r.json());
    if (!shape) return undefined;
    shapes.set(keyOf(body), shape);
    return pattern(shape);
  } catch {
    return undefined;
  }
}

/** The box shows for "my array"; opened empty, it starts from the pattern of the last answer's
 * shape (`data`), to edit. */
export function showGrad(data = null) {
  const mine = mode() === "mine";
  $("backward-set").hidden = mode() === ""; // its words and box only once a backward is asked
  $("grad-output-field").hidden = !mine;
  const shape = lastShape(data);
  if (mine && !$("grad_output").value.trim() && shape)
    $("grad_output").value = formatMatrix(pattern(shape));
}

/** The backward's fields from a request `ex` (form.js's fillForm): off unless it has grad_output. */
export function fillGrad(ex) {
  $("grad_output").value = "";
  $("grad_mode").value = "";
  const given = ex.grad_output;
  delete ex.grad_output;
  if (given === "sum") $("grad_mode").value = "sum";
  else if (Array.isArray(given)) {
    $("grad_mode").value = "mine";
    $("grad_output").value = formatMatrix(given);
  } else if (given !== undefined) ex.grad_output = given; // the service says what is wrong
  showGrad();
}
