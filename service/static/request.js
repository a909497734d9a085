// @ts-check
// The request body read from the form: each field's text as numbers (a FieldError names a field
// that cannot be read), the body built from every field, and formBody, which shows that error
// instead (Run, run.js, and Copy as curl, export.js, send the body).
import { $, state, FieldError } from "./lib/state.js";
import { parseMatrix, parseInts, numbersOrUndefined, numberOrUndefined } from "./lib/fields.js";
import { weightName, STATE_DICT, layoutChosen } from "./form.js";
import { layersBody, withoutValues } from "./layers/form.js";
import { clearErrors, showErrors } from "./errors.js";
import { gradBody } from "./backward-form.js";

// the text of a field as numbers (lib/fields.js), as this module has always offered it
export { parseMatrix, parseInts, numbersOrUndefined, numberOrUndefined };

// ---- the body --------------------------------------------------------------------------------

export function buildBody() {
  const ep = $("endpoint").value;
  const mode = $("mode").value;
  const body = {};
  const tokens = $("tokens").value.trim();
  if (tokens) body.tokens = tokens.split(/\s+/);
  if (mode === "generated") {
    const sentence = $("sentence").value.trim();
    if (sentence) {
      body.sentence = sentence;
      delete body.tokens;
    }
    for (const id of ["seed", "d_model", "d_k"]) {
      const n = numberOrUndefined(id);
      if (n !== undefined) body[id] = n;
    }
    if ($("init").value !== "uniform") body.init = $("init").value;
  }
  const matrices =
    mode === "direct"
      ? ["q", "k", "v"]
      : mode === "projections"
        ? ["x", "w_q", "w_k", "w_v", "context"]
        : ["x", "w_q", "w_k", "w_v"];
  for (const id of matrices) {
    if (id === "w_v" && withoutValues()) continue; // k_eq_v: the values are the keys
    const m = parseMatrix(id);
    if (m !== undefined) body[id in STATE_DICT ? weightName(id) : id] = m;
  }
  if (layoutChosen() && $("weight_layout").value !== "in_out")
    body.weight_layout = $("weight_layout").value;
  const scale = numberOrUndefined("scale");
  if (scale !== undefined) body.scale = scale;
  if ($("fully_masked_rows").value !== "zero")
    body.fully_masked_rows = $("fully_masked_rows").value;

  const masks = [];
  state.maskSources = [];
  const add = (m, source) => {
    masks.push(m);
    state.maskSources.push(source);
  };
  if ($("causal").checked) add({ type: "causal", alignment: $("alignment").value }, "alignment");
  const keyLengths = parseInts("key_lengths");
  const queryLengths = parseInts("query_lengths");
  if (keyLengths !== undefined || queryLengths !== undefined) {
    const m = { type: "padding" };
    if (keyLengths !== undefined) m.key_lengths = keyLengths;
    if (queryLengths !== undefined) m.query_lengths = queryLengths;
    add(m, keyLengths !== undefined ? "key_lengths" : "query_lengths");
  }
  const left = numberOrUndefined("window_left");
  const right = numberOrUndefined("window_right");
  if (left !== undefined || right !== undefined)
    add({ type: "window", left: left ?? null, right: right ?? null }, "window_left");
  const chunk = numberOrUndefined("chunk_size");
  if (chunk !== undefined) add({ type: "chunked", size: chunk }, "chunk_size");
  const boolean = parseMatrix("boolean");
  if (boolean !== undefined) add({ type: "boolean", matrix: boolean }, "boolean");
  const additive = parseMatrix("additive");
  if (additive !== undefined) add({ type: "additive", matrix: additive }, "additive");
  if (masks.length) body.mask = masks.length === 1 ? masks[0] : masks;

  // position and score variants (API 2.6): only what is set; defaults alone send `true`
  const clip = numberOrUndefined("clip_qkv"); // OLMo's clamp, right after the projections
  if (clip !== undefined) body.clip_qkv = clip;
  layersBody(body, ep); // qk_norm, v_norm, temperature; /multihead's k_eq_v and gate
  if ($("rope").checked) {
    const rope = {};
    const base = numberOrUndefined("rope_base");
    if (base !== undefined) rope.base = base;
    if ($("rope_style").value !== "half") rope.style = $("rope_style").value;
    const dim = numberOrUndefined("rope_rotary_dim");
    if (dim !== undefined) rope.rotary_dim = dim;
    body.rope = Object.keys(rope).length ? rope : true;
  }
  const multiplier = numberOrUndefined("attention_multiplier"); // Granite's scale
  if (multiplier !== undefined) body.attention_multiplier = multiplier;
  const softcap = numberOrUndefined("softcap");
  if (softcap !== undefined) body.softcap = softcap;
  if ($("alibi").checked) body.alibi = $("alibi_symmetric").checked ? { symmetric: true } : true;
  const sinks = numbersOrUndefined("sinks", false);
  if (sinks !== undefined) {
    if (ep === "multihead") body.sinks = sinks;
    else if (sinks.length === 1) body.sinks = sinks[0];
    else
      throw new FieldError(
        "sinks",
        "sinks: one number on this endpoint (one per head on /multihead)",
      );
  }
  const positions = numbersOrUndefined("positions", true);
  if (positions !== undefined) body.positions = positions;

  if (ep === "multihead") {
    body.num_heads = numberOrUndefined("num_heads") ?? 1;
    const kv = numberOrUndefined("num_kv_heads");
    if (kv !== undefined) body.num_kv_heads = kv;
    const pe = $("positional_kind").value;
    if (pe === "sinusoidal") body.positional_encoding = "sinusoidal";
    if (pe === "matrix") body.positional_encoding = parseMatrix("positional_matrix");
    if ($("residual").checked) body.residual = true;
    if ($("layer_norm").checked)
      body.layer_norm = $("ln_over").value === "features" ? true : { over: $("ln_over").value };
    const wo = parseMatrix("w_o");
    if (wo !== undefined) body[weightName("w_o")] = wo;
  }
  const extra = $("extra").value.trim();
  if (extra) {
    let more;
    try {
      more = JSON.parse(extra);
    } catch (e) {
      throw new FieldError("extra", `more fields: not valid JSON (${e.message})`);
    }
    if (typeof more !== "object" || Array.isArray(more) || more === null)
      throw new FieldError("extra", 'more fields: a JSON object, e.g. {"b_q": [0, 1]}');
    Object.assign(body, more);
  }
  gradBody(body); // last: the pattern's shape is known by the rest of the body
  return body;
}

// The form's request body, or undefined when a field cannot be read: then its error is shown at
// the top and next to the field (errors clear first).
export function formBody() {
  clearErrors();
  try {
    return buildBody();
  } catch (e) {
    if (!(e instanceof FieldError)) throw e;
    showErrors(e.message, [{ field: e.field, message: e.message }]);
    return undefined;
  }
}
