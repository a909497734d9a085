// @ts-check
// The form: which fields show for the endpoint and the input mode (each mode keeps its own
// numbers), the weight boxes' names and shapes, the worked examples, and filling the form from
// one. (The request body read from it: request.js; its errors shown next to fields: errors.js.)
import { $, state, loadSpec } from "./lib/state.js";
import { formatMatrix } from "./lib/format.js";
import { LAYER_TEXT_IDS, fillLayers, resetLayers, showLayers } from "./layers/form.js";
import { fillGrad } from "./backward-form.js";

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
  "clip_qkv",
  "attention_multiplier",
  "softcap",
  "rope_base",
  "rope_rotary_dim",
  "sinks",
  "positions",
  "extra",
  ...LAYER_TEXT_IDS,
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
  showLayout(); // before the labels, which read it
  for (const [id, text] of Object.entries(weightLabels(ep))) $(`${id}-name`).textContent = text;
  $("sinks-label").textContent =
    ep === "multihead"
      ? "sinks (blank: off; one number per head)"
      : "sinks (blank: off; one number)";
  $("mask-set").querySelector("legend").textContent =
    ep === "mask"
      ? "Mask (required; combined with AND; true = may attend)"
      : "Mask (optional; combined with AND; true = may attend)";
  showLayers(); // after the weight boxes' names, which it may add to
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
export const STATE_DICT = {
  w_q: "q_proj.weight",
  w_k: "k_proj.weight",
  w_v: "v_proj.weight",
  w_o: "o_proj.weight",
};
const stateDict = () =>
  $("endpoint").value === "multihead" && $("weight_names").value === "state_dict";

/** The name the request gives the matrix of weight box `id` (w_q, w_k, w_v, w_o). */
export function weightName(id) {
  return stateDict() ? STATE_DICT[id] : id;
}

// A state dict's weights (q_proj.weight …) are always out_in, as PyTorch stores them: while the
// boxes send those names the layout control shows out_in and is off (the request then carries no
// weight_layout of its own); w_q … w_o give it back as the user left it.
const LAYOUT_FIXED = "q_proj.weight … are always out_in (X · Wᵀ), as PyTorch stores them";
let chosenLayout = "in_out";
function showLayout() {
  const control = $("weight_layout");
  if (stateDict()) {
    if (!control.disabled) chosenLayout = control.value;
    control.value = "out_in";
    control.disabled = true;
    control.title = LAYOUT_FIXED;
  } else if (control.disabled) {
    control.value = chosenLayout;
    control.disabled = false;
    control.title = "";
  }
}

/** Whether the form's weight_layout is the user's (false: fixed by a state dict's names). */
export const layoutChosen = () => !$("weight_layout").disabled;

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
  resetLayers();
  $("rope_style").value = "half";
  $("weight_layout").disabled = false; // the example's layout, not one a state dict fixed
  $("weight_layout").title = "";
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
    } else if (m.type === "chunked" && !$("chunk_size").value && Number.isInteger(m.size))
      $("chunk_size").value = m.size;
    else if (m.type === "boolean" && !$("boolean").value)
      $("boolean").value = formatMatrix(m.matrix);
    else if (m.type === "additive" && !$("additive").value)
      $("additive").value = formatMatrix(m.matrix);
    else leftover.push(m);
  }
  if (leftover.length) ex.mask = leftover; // kinds repeated beyond what the form holds
  fillGrad(ex); // grad_output: "sum", an array in its box, or off
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
  fillLayers(ex); // qk_norm, v_norm, temperature, k_eq_v, the gate (layers/form.js)
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
  // the numbers that turn a variant on (blank, or null in a request, is off)
  for (const id of ["clip_qkv", "attention_multiplier", "softcap"]) {
    if (typeof ex[id] === "number") $(id).value = String(ex[id]);
    if (typeof ex[id] === "number" || ex[id] === null) delete ex[id];
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
