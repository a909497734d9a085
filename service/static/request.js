// @ts-check
// The form: state, form <-> request body, worked examples, and errors next to fields (Run, which
// sends the body and draws the answer: run.js).

/**
 * A form control: nearly every id `$` is given names an input, select or textarea whose value,
 * checked or options the caller reads. The type is their union of members so that the ~170 calls
 * need no cast each; an id naming a div or a canvas is used only through HTMLElement's members.
 * @typedef {HTMLInputElement & HTMLSelectElement & HTMLTextAreaElement} Control
 */

/** @type {(id: string) => Control} */
export const $ = (id) => /** @type {Control} */ (document.getElementById(id));
// spec: the OpenAPI document; lastBody: the body last sent; lastResult: {ep, body, data};
// maskSources: for each mask object sent, the form field it came from
export const state = { spec: null, lastBody: null, lastResult: null, maskSources: [] };
// ---- text <-> matrices ------------------------------------------------------------------

export class FieldError extends Error {
  constructor(field, message) {
    super(message);
    this.field = field;
  }
}

export function parseMatrix(id) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  if (text.startsWith("[")) {
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new FieldError(id, `${id}: not valid JSON (${e.message})`);
    }
  }
  return text
    .split(/\n|;/)
    .map((r) => r.trim())
    .filter(Boolean)
    .map((row, i) =>
      row
        .split(/[\s,]+/)
        .filter(Boolean)
        .map((tok) => {
          if (tok === "null") return null;
          if (tok === "true") return true;
          if (tok === "false") return false;
          const n = Number(tok);
          if (!Number.isFinite(n))
            throw new FieldError(id, `${id} row ${i}: "${tok}" is not a number`);
          return n;
        }),
    );
}

export function formatMatrix(m) {
  if (!Array.isArray(m)) return "";
  const flat = m.every((row) => Array.isArray(row) && row.every((v) => !Array.isArray(v)));
  return flat
    ? m.map((row) => row.map((v) => (v === null ? "null" : String(v))).join(" ")).join("\n")
    : JSON.stringify(m);
}

export function parseInts(id) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  const values = text.split(/[\s,]+/).map(Number);
  if (values.some((v) => !Number.isInteger(v) || v < 0))
    throw new FieldError(id, `${id}: whole numbers ≥ 0, separated by spaces`);
  return values.length === 1 ? values[0] : values;
}

export function numbersOrUndefined(id, integers) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  const values = text.split(/[\s,]+/).map(Number);
  if (values.some((v) => (integers ? !Number.isInteger(v) : !Number.isFinite(v)))) {
    throw new FieldError(
      id,
      `${id}: ${integers ? "whole numbers" : "numbers"}, separated by spaces`,
    );
  }
  return values;
}

export function numberOrUndefined(id) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  const n = Number(text);
  if (!Number.isFinite(n)) throw new FieldError(id, `${id}: "${text}" is not a number`);
  return n;
}

// ---- the form -----------------------------------------------------------------------------

export const TEXT_IDS = [
  "tokens",
  "sentence",
  "seed",
  "d_model",
  "d_k",
  "x",
  "w_q",
  "w_k",
  "w_v",
  "q",
  "k",
  "v",
  "context",
  "scale",
  "key_lengths",
  "query_lengths",
  "window_left",
  "window_right",
  "boolean",
  "additive",
  "num_kv_heads",
  "positional_matrix",
  "w_o",
  "softcap",
  "rope_base",
  "rope_rotary_dim",
  "sinks",
  "positions",
  "extra",
];

// Each input mode keeps its own numbers: switching the mode puts the fields of the mode left
// away (they come back on return) and brings the new mode's, so that a request never carries
// another mode's values (x from the projections in a generated request, say).
const MODE_FIELDS = {
  projections: ["x", "w_q", "w_k", "w_v", "context"],
  direct: ["q", "k", "v"],
  generated: ["sentence", "seed", "d_model", "d_k", "x", "w_q", "w_k", "w_v"],
};
const modeState = { shown: null, stash: {} };

function swapModeFields(next) {
  const { shown, stash } = modeState;
  if (shown && shown !== next) {
    stash[shown] = Object.fromEntries(MODE_FIELDS[shown].map((id) => [id, $(id).value]));
    for (const id of MODE_FIELDS[next]) $(id).value = (stash[next] && stash[next][id]) ?? "";
  }
  modeState.shown = next;
}

export function showFor() {
  const ep = $("endpoint").value;
  const mode = $("mode").value;
  /** @type {HTMLOptionElement} */ ($("mode").querySelector('option[value="direct"]')).disabled =
    ep === "multihead";
  if (ep === "multihead" && mode === "direct") $("mode").value = "projections";
  const current = $("mode").value;
  swapModeFields(current);
  /** @type {NodeListOf<HTMLElement>} */ (
    document.querySelectorAll(".mode-projections, .mode-direct, .mode-generated")
  ).forEach((el) => {
    el.hidden = !el.classList.contains(`mode-${current}`);
  });
  $("multihead-set").hidden = ep !== "multihead";
  $("weight-names-field").hidden ||= ep !== "multihead"; // state-dict names: /multihead's only
  // generated d_k: what a blank one defaults to on this endpoint
  const dk = ep === "multihead" ? "= d_model ÷ heads" : "= d_model";
  $("d_k").placeholder = dk;
  $("d_k-hint").textContent = `(blank: ${dk})`;
  for (const [id, text] of Object.entries(weightLabels(ep))) $(`${id}-name`).textContent = text;
  $("sinks-label").textContent =
    ep === "multihead"
      ? "sinks (blank: off; one number per head)"
      : "sinks (blank: off; one number)";
  $("mask-set").querySelector("legend").textContent =
    ep === "mask"
      ? "Mask (required; combined with AND; true = may attend)"
      : "Mask (optional; combined with AND; true = may attend)";
}

// The weight boxes' names and shapes, in the layout the form sends them: w_q … w_o in the chosen
// weight layout, or a state dict's names (always out_in) when the form sends those.
const SHAPES = {
  attention: { w_q: ["d_model", "d_k"], w_k: ["d_model", "d_k"], w_v: ["d_model", "d_v"] },
  multihead: {
    w_q: ["d_model", "h·d_k"],
    w_k: ["d_model", "h_kv·d_k"],
    w_v: ["d_model", "h_kv·d_v"],
    w_o: ["h·d_v", "d_out"],
  },
};
const STATE_DICT = {
  w_q: "q_proj.weight",
  w_k: "k_proj.weight",
  w_v: "v_proj.weight",
  w_o: "o_proj.weight",
};
const stateDict = () =>
  $("endpoint").value === "multihead" && $("weight_names").value === "state_dict";

/** The name the request gives the matrix of weight box `id` (w_q, w_k, w_v, w_o). */
function weightName(id) {
  return stateDict() ? STATE_DICT[id] : id;
}

function weightLabels(ep) {
  const shapes = SHAPES[ep === "multihead" ? "multihead" : "attention"];
  const outIn = stateDict() || $("weight_layout").value === "out_in";
  const labels = {};
  for (const id of ["w_q", "w_k", "w_v", "w_o"]) {
    const [a, b] = shapes[id] || shapes.w_q;
    labels[id] =
      `${weightName(id)} [${outIn ? `${b} × ${a}` : `${a} × ${b}`}] (${outIn ? "out_in" : "in_out"}${id === "w_o" ? "; blank: identity" : ""})`;
  }
  return labels;
}

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
    const m = parseMatrix(id);
    if (m !== undefined) body[id in STATE_DICT ? weightName(id) : id] = m;
  }
  if ($("weight_layout").value !== "in_out") body.weight_layout = $("weight_layout").value;
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
  const boolean = parseMatrix("boolean");
  if (boolean !== undefined) add({ type: "boolean", matrix: boolean }, "boolean");
  const additive = parseMatrix("additive");
  if (additive !== undefined) add({ type: "additive", matrix: additive }, "additive");
  if (masks.length) body.mask = masks.length === 1 ? masks[0] : masks;

  // position and score variants (API 2.6): only what is set; defaults alone send `true`
  if ($("qk_norm").value)
    body.qk_norm = $("qk_norm").value === "rms" ? true : { type: $("qk_norm").value };
  if ($("rope").checked) {
    const rope = {};
    const base = numberOrUndefined("rope_base");
    if (base !== undefined) rope.base = base;
    if ($("rope_style").value !== "half") rope.style = $("rope_style").value;
    const dim = numberOrUndefined("rope_rotary_dim");
    if (dim !== undefined) rope.rotary_dim = dim;
    body.rope = Object.keys(rope).length ? rope : true;
  }
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

export function fillForm(example) {
  const ex = { ...example };
  delete ex.include; // the explorer shows every step
  // a state dict's weights (q_proj.weight …) go into the weight boxes, which then send those names
  const named = Object.entries(STATE_DICT).filter(([, name]) => ex[name] !== undefined);
  const asStateDict =
    named.length > 0 && Object.keys(STATE_DICT).every((id) => ex[id] === undefined);
  $("weight_names").value = asStateDict ? "state_dict" : "w";
  if (asStateDict)
    for (const [id, name] of named) {
      ex[id] = ex[name];
      delete ex[name];
    }
  for (const id of TEXT_IDS) $(id).value = "";
  for (const id of ["causal", "residual", "layer_norm", "rope", "alibi", "alibi_symmetric"])
    $(id).checked = false;
  $("qk_norm").value = "";
  $("rope_style").value = "half";
  $("weight_layout").value = "in_out";
  $("fully_masked_rows").value = "zero";
  $("init").value = "uniform";
  $("alignment").value = "upper_left";
  $("positional_kind").value = "";
  $("ln_over").value = "features";
  $("num_heads").value = "2";

  const generated =
    ex.seed !== undefined && ["x", "w_q", "w_k", "w_v"].some((n) => ex[n] === undefined);
  $("mode").value = ex.q !== undefined ? "direct" : generated ? "generated" : "projections";
  modeState.shown = $("mode").value;
  modeState.stash = {}; // an example starts every mode afresh
  const take = (name) => {
    const v = ex[name];
    delete ex[name];
    return v;
  };
  const tokens = take("tokens");
  if (tokens) $("tokens").value = tokens.join(" ");
  for (const id of ["sentence", "seed", "d_model", "d_k"]) {
    const v = take(id);
    if (v !== undefined) $(id).value = v;
  }
  const init = take("init");
  if (init) $("init").value = init;
  for (const id of ["x", "w_q", "w_k", "w_v", "q", "k", "v", "context", "w_o"]) {
    const v = take(id);
    if (v !== undefined) $(id).value = formatMatrix(v);
  }
  for (const id of ["weight_layout", "fully_masked_rows"]) {
    const v = take(id);
    if (v !== undefined) $(id).value = v;
  }
  const scale = take("scale");
  if (scale !== undefined && scale !== null) $("scale").value = scale;
  const mask = take("mask");
  const leftover = [];
  for (const m of mask === undefined ? [] : Array.isArray(mask) ? mask : [mask]) {
    if (m.type === "causal" && !$("causal").checked) {
      $("causal").checked = true;
      $("alignment").value = m.alignment || "upper_left";
    } else if (m.type === "padding" && !$("key_lengths").value && !$("query_lengths").value) {
      if (m.key_lengths !== undefined) $("key_lengths").value = [].concat(m.key_lengths).join(" ");
      if (m.query_lengths !== undefined)
        $("query_lengths").value = [].concat(m.query_lengths).join(" ");
    } else if (m.type === "window" && !$("window_left").value && !$("window_right").value) {
      if (m.left !== undefined && m.left !== null) $("window_left").value = m.left;
      if (m.right !== undefined && m.right !== null) $("window_right").value = m.right;
    } else if (m.type === "boolean" && !$("boolean").value)
      $("boolean").value = formatMatrix(m.matrix);
    else if (m.type === "additive" && !$("additive").value)
      $("additive").value = formatMatrix(m.matrix);
    else leftover.push(m);
  }
  if (leftover.length) ex.mask = leftover; // kinds repeated beyond what the form holds
  fillVariants(ex);
  const heads = take("num_heads");
  if (heads !== undefined) $("num_heads").value = heads;
  const kv = take("num_kv_heads");
  if (kv !== undefined) $("num_kv_heads").value = kv;
  const pe = take("positional_encoding");
  if (pe === "sinusoidal") $("positional_kind").value = "sinusoidal";
  else if (pe !== undefined) {
    $("positional_kind").value = "matrix";
    $("positional_matrix").value = formatMatrix(pe);
  }
  if (take("residual")) $("residual").checked = true;
  const ln = take("layer_norm");
  if (ln) {
    $("layer_norm").checked = true;
    if (typeof ln === "object" && ln.over) $("ln_over").value = ln.over;
    if (typeof ln === "object" && Object.keys(ln).some((key) => key !== "over")) {
      const { over, ...rest } = ln;
      ex.layer_norm = { over: over || "features", ...rest };
      $("layer_norm").checked = false;
    }
  }
  if (Object.keys(ex).length) $("extra").value = JSON.stringify(ex);
  showFor();
}

// The variants the form holds move from `ex` into the form; other settings stay in `ex` (more fields).
export function fillVariants(ex) {
  const only = (v, keys) =>
    v === true ||
    (v &&
      typeof v === "object" &&
      !Array.isArray(v) &&
      Object.keys(v).every((k) => keys.includes(k)));
  const qk = ex.qk_norm;
  if (only(qk, ["type"])) {
    $("qk_norm").value = qk === true ? "rms" : qk.type || "rms";
    delete ex.qk_norm;
  }
  const rope = ex.rope;
  if (only(rope, ["base", "style", "rotary_dim"])) {
    $("rope").checked = true;
    if (rope !== true) {
      if (rope.base !== undefined) $("rope_base").value = rope.base;
      if (rope.style) $("rope_style").value = rope.style;
      if (rope.rotary_dim !== undefined) $("rope_rotary_dim").value = rope.rotary_dim;
    }
    delete ex.rope;
  }
  const alibi = ex.alibi;
  if (only(alibi, ["symmetric"])) {
    $("alibi").checked = true;
    $("alibi_symmetric").checked = alibi !== true && !!alibi.symmetric;
    delete ex.alibi;
  }
  if (typeof ex.softcap === "number") {
    $("softcap").value = ex.softcap;
    delete ex.softcap;
  }
  if (
    typeof ex.sinks === "number" ||
    (Array.isArray(ex.sinks) && ex.sinks.every((n) => typeof n === "number"))
  ) {
    $("sinks").value = [].concat(ex.sinks).join(" ");
    delete ex.sinks;
  }
  if (Array.isArray(ex.positions) && ex.positions.every(Number.isInteger)) {
    $("positions").value = ex.positions.join(" ");
    delete ex.positions;
  }
}

export async function loadSpec() {
  if (!state.spec) state.spec = await (await fetch("openapi.json")).json();
  return state.spec;
}

export async function loadExamples() {
  const ep = $("endpoint").value;
  await loadSpec();
  const examples =
    state.spec.paths[`/${ep}`].post.requestBody.content["application/json"].examples || {};
  const select = $("example");
  select.replaceChildren(new Option("— choose —", ""));
  for (const [key, ex] of Object.entries(examples)) select.add(new Option(ex.summary || key, key));
  return examples;
}

// ---- errors next to their fields ----------------------------------------------------------

export function clearErrors() {
  $("error").hidden = true;
  $("error").textContent = "";
  $("outcome-error").hidden = true;
  $("outcome-error").textContent = "";
  document.querySelectorAll(".field-error").forEach((el) => el.remove());
  document.querySelectorAll(".has-error").forEach((el) => el.classList.remove("has-error"));
}

export function formFieldFor(apiField) {
  if (!apiField) return null;
  const mask = /^mask\[(\d+)\]/.exec(apiField);
  let name = apiField.split(/[.[]/)[0];
  const weight = /^([qkvo])_proj[._]weight/.exec(apiField); // a state dict's, in its weight box
  if (weight && weightName(`w_${weight[1]}`) !== `w_${weight[1]}`) name = `w_${weight[1]}`;
  if (mask) name = state.maskSources[Number(mask[1])] || "key_lengths";
  if (name === "mask") name = state.maskSources[0] || "key_lengths";
  const el = document.querySelector(`.field[data-field="${CSS.escape(name)}"]`);
  if (el && !el.closest("[hidden]")) return el;
  return document.querySelector('.field[data-field="extra"]');
}

export function showErrors(message, errors) {
  const banner = $("error");
  banner.textContent = message;
  banner.hidden = false;
  $("outcome-error").textContent = message;
  $("outcome-error").hidden = false;
  for (const err of errors) {
    const field = formFieldFor(err.field);
    if (!field) continue;
    field.classList.add("has-error");
    const p = document.createElement("p");
    p.className = "field-error";
    p.textContent = err.message;
    field.append(p);
  }
  const first = document.querySelector(".has-error input, .has-error textarea, .has-error select");
  if (first) first.setAttribute("aria-describedby", "error");
}
